//go:build unix

package drivesync

import (
	"fmt"
	"os"
	"syscall"
)

// fileID names the file at path by its device and inode, which a copy
// does not share and a rename keeps; "" if there is no such file.
func fileID(path string) string {
	if path == "" {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}
