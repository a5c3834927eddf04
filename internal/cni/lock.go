package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ContainerLock is held while a container's record and attachments change.
// Its holders are in different processes: the node side's ADD and
// hot-plug, the plugin's DEL and GC. Without it, a DEL the runtime sends
// after killing a plugin raced the node side undoing that plugin's ADD
// over the record, and a hot-plug raced a DEL: a record left for
// interfaces already gone, or a record dropped for one still there.
type ContainerLock struct {
	file           *os.File
	path, recorded string
}

// Lock takes the container's lock, waiting for its holder; it ends with
// Unlock or with the process. It is an flock(2) on a file beside the
// record, which Unlock removes with the record.
func (s Store) Lock(containerID string) (*ContainerLock, error) {
	recorded, err := s.path(containerID)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("attachment records: %w", err)
	}
	path := strings.TrimSuffix(recorded, ".json") + ".lock"
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("locking the record of %s: %w", containerID, err)
		}
		if err := flock(f); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("locking the record of %s: %w", containerID, err)
		}
		// The holder before may have removed the file while this one
		// waited on it: a lock on a removed file locks nothing the next
		// caller sees.
		held, err := f.Stat()
		if err == nil {
			var now fs.FileInfo
			if now, err = os.Stat(path); err == nil && os.SameFile(held, now) {
				return &ContainerLock{file: f, path: path, recorded: recorded}, nil
			}
		}
		_ = f.Close()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("locking the record of %s: %w", containerID, err)
		}
	}
}

// flock takes f's exclusive lock, waiting for it.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Unlock releases the lock, and removes its file if the container has no
// record left: one file per container that ever ran would pile up.
func (l *ContainerLock) Unlock() error {
	var err error
	if _, statErr := os.Stat(l.recorded); errors.Is(statErr, fs.ErrNotExist) {
		if err = os.Remove(l.path); errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	}
	if closeErr := l.file.Close(); closeErr != nil {
		err = errors.Join(err, closeErr)
	}
	if err != nil {
		return fmt.Errorf("unlocking %s: %w", l.path, err)
	}
	return nil
}

// LoadLocked takes the container's lock and reads its record under it; ok
// is false when there is none. The caller unlocks, also after an error
// reading the record.
func (s Store) LoadLocked(containerID string) (r Record, ok bool, l *ContainerLock, err error) {
	if l, err = s.Lock(containerID); err != nil {
		return r, false, nil, err
	}
	r, ok, err = s.Load(containerID)
	return r, ok, l, err
}
