package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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
	Pod string `json:"pod"`
	// PodUID is the pod's UID when the runtime passed it (K8S_POD_UID):
	// a pod made again under the same name (a StatefulSet's) is another.
	PodUID     string              `json:"podUID,omitempty"`
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

// validContainerID accepts what runtimes use: letters, digits, '.', '_',
// '-', starting with a letter or digit, at most 128 (the CNI spec's rule),
// which also keeps a record's file inside Dir. A loop, not a regexp: the
// plugin checks it on every command, and compiling `{0,127}` at start took
// a tenth of the plugin's start-up.
func validContainerID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func (s Store) path(containerID string) (string, error) {
	if !validContainerID(containerID) {
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

// ErrUnreadable marks a record that is not what netop writes (another
// version's, or edited by hand): what its container holds is not known
// from it.
var ErrUnreadable = errors.New("not a record netop wrote")

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
		return Record{}, false, fmt.Errorf("record of %s: %w: %w", containerID, ErrUnreadable, err)
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

// List reads every record. unreadable are the containers whose record is
// not one (ErrUnreadable): they hold what no record says, and must not be
// taken for holding nothing. A file not named as Save names records is not
// one, and is passed over.
func (s Store) List() (records []Record, unreadable []string, err error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || !validContainerID(id) {
			continue
		}
		r, found, err := s.Load(id)
		switch {
		case errors.Is(err, ErrUnreadable):
			unreadable = append(unreadable, id)
		case err != nil:
			return nil, nil, err
		case found:
			records = append(records, r)
		}
	}
	return records, unreadable, nil
}

// Prefixes parses addresses as allocations and records write them, with
// the Network's prefix length.
func Prefixes(ips []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, ip := range ips {
		p, err := netip.ParsePrefix(ip)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", ip, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// With is the record with interfaces added, replacing any of the same
// name.
func (r Record) With(interfaces ...RecordedInterface) Record {
	r.Interfaces = slices.Clone(r.Interfaces)
	for _, added := range interfaces {
		r.Interfaces = slices.DeleteFunc(r.Interfaces, func(i RecordedInterface) bool { return i.Interface == added.Interface })
		r.Interfaces = append(r.Interfaces, added)
	}
	return r
}

// Without is the record without the interfaces named.
func (r Record) Without(interfaces []string) Record {
	r.Interfaces = slices.DeleteFunc(slices.Clone(r.Interfaces), func(i RecordedInterface) bool { return slices.Contains(interfaces, i.Interface) })
	return r
}

// Forget drops interfaces from the container's record, and the record
// once it has none.
func (s Store) Forget(record Record, interfaces []string) error {
	if len(interfaces) == 0 {
		return nil
	}
	record = record.Without(interfaces)
	if len(record.Interfaces) == 0 {
		if err := s.Remove(record.ContainerID); err != nil {
			return fmt.Errorf("removing the record of %s: %w", record.ContainerID, err)
		}
		return nil
	}
	if err := s.Save(record); err != nil {
		return fmt.Errorf("removing %s from the record of %s: %w", strings.Join(interfaces, ", "), record.ContainerID, err)
	}
	return nil
}
