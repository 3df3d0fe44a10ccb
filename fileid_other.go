//go:build !unix

package drivesync

// fileID: this system gives no inode through os.Stat, so a copied
// database file is found by its files on the remote only (see
// checkCopied).
func fileID(path string) string { return "" }
