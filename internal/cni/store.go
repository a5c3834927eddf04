package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/netop-dev/netop/internal/atomicfile"
)

// Store records on the node what ADD attached for each container, so that
// DEL, CHECK and GC can undo or verify it with the API server down. One
// file per container, written whole (a new file renamed over the old), so a
// crash never leaves half a record.
type Store struct {
	Dir string
}

// Record is what ADD attached for one container.
type Record struct {
	ContainerID string `json:"containerID"`
	// Netns is the pod's network namespace path.
	Netns string `json:"netns"`
	// Pod is namespace/name.
	Pod        string              `json:"pod"`
	Interfaces []RecordedInterface `json:"interfaces"`
}

// RecordedInterface is one attachment of a container.
type RecordedInterface struct {
	// Config is the name of the network configuration that attached it,
	// for GC, which the runtime calls per configuration.
	Config    string   `json:"config"`
	Interface string   `json:"interface"`
	Network   string   `json:"network"`
	Bridge    string   `json:"bridge"`
	HostVeth  string   `json:"hostVeth"`
	IPs       []string `json:"ips"`
	MAC       string   `json:"mac"`
}

// containerIDs are what runtimes use: letters, digits, '.', '_', '-'
// (the CNI spec's rule), which also keeps a record's file inside Dir.
var containerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$`)

func (s Store) path(containerID string) (string, error) {
	if !containerIDPattern.MatchString(containerID) {
		return "", fmt.Errorf("container ID %q: must be letters, digits, '.', '_' or '-', at most 128", containerID)
	}
	return filepath.Join(s.Dir, containerID+".json"), nil
}

// Save writes r, replacing the container's earlier record.
func (s Store) Save(r Record) error {
	path, err := s.path(r.ContainerID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("attachment records: %w", err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("writing the record of %s: %w", r.ContainerID, err)
	}
	return nil
}

// Load reads a container's record; ok is false when there is none.
func (s Store) Load(containerID string) (r Record, ok bool, err error) {
	path, err := s.path(containerID)
	if err != nil {
		return r, false, err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, false, nil
	}
	if err != nil {
		return r, false, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, false, fmt.Errorf("record of %s: %w", containerID, err)
	}
	return r, true, nil
}

// Remove deletes a container's record; none is not an error.
func (s Store) Remove(containerID string) error {
	path, err := s.path(containerID)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// List reads every record.
func (s Store) List() ([]Record, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		r, found, err := s.Load(id)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, r)
		}
	}
	return out, nil
}
