package cni

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ContainerLock is held while a container's record and attachments change.
// Its holders are in different processes: the node side's ADD and
// hot-plug, the plugin's DEL and GC. Without it, a DEL the runtime sends
// after killing a plugin raced the node side undoing that plugin's ADD
// over the record, and a hot-plug raced a DEL: a record left for
// interfaces already gone, or a record dropped for one still there.
type ContainerLock struct {
	file *os.File
}

// lockFile holds the containers' locks: one byte of it each, at an offset
// their ID hashes to. One file that is never removed, rather than a file
// per container: creating and removing a file in the records' directory
// is what a record's write costs most, and a lock file removed while
// another process waits on it locks nothing.
const lockFile = "containers.lock"

// Lock takes the container's lock, waiting for its holder; it ends with
// Unlock or with the process. It is an open file description lock
// (F_OFD_SETLKW) on the container's byte of the directory's lock file.
// Two containers whose IDs hash alike wait for each other, which is all
// it costs them. The wait takes no context: every holder's work is
// bounded (an ADD by its caller and timeout, hot-plug by its bridge wait,
// DEL and GC by the kernel's answers).
func (s Store) Lock(containerID string) (*ContainerLock, error) {
	if _, err := s.path(containerID); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("attachment records: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking the record of %s: %w", containerID, err)
	}
	h := fnv.New64a()
	_, _ = io.WriteString(h, containerID)
	lock := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: int64(h.Sum64() >> 2), Len: 1}
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lock)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("locking the record of %s: %w", containerID, err)
	}
	return &ContainerLock{file: f}, nil
}

// Unlock releases the lock.
func (l *ContainerLock) Unlock() error {
	if err := l.file.Close(); err != nil {
		return fmt.Errorf("unlocking a container's record: %w", err)
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
