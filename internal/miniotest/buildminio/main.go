// Command buildminio builds the MinIO server the S3 tests run (see
// package miniotest) into its cache directory, unless it is there
// already, and prints its path.
package main

import (
	"fmt"
	"os"

	"github.com/drivesync/drivesync/internal/miniotest"
)

func main() {
	bin, err := miniotest.Binary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "buildminio:", err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
