// Package atomicfile writes files that readers see whole or not at all:
// what a CNI runtime, a plugin or a crash-restarted netop reads must never
// be half written.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path with mode through a temporary file in the same
// directory, synced, then renamed over path: a reader sees the old file or
// the new one. The directory must exist.
func Write(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename
	for _, step := range []func() error{
		func() error { _, err := tmp.Write(data); return err },
		func() error { return tmp.Chmod(mode) },
		tmp.Sync,
	} {
		if err := step(); err != nil {
			_ = tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
