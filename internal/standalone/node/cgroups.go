package node

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// cgroupRoot is the kubelet's cgroupRoot, made in every cgroup hierarchy
// (the kubelet refuses a cgroupRoot that does not exist), so that each
// node's pods live under a cgroup of their own: several nodes can run on
// one host.
type cgroupRoot struct {
	name string
	// dirs are the cgroup's directories, one per hierarchy.
	dirs []string
}

// CgroupV1 reports whether the host has cgroup v1 controllers (a v1 or
// hybrid host): the kubelet then needs failCgroupV1: false.
func CgroupV1() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err != nil
}

func makeCgroupRoot(name string) (*cgroupRoot, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	c := &cgroupRoot{name: name}
	for _, m := range mounts {
		dir := filepath.Join(m.path, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("making cgroup %s: %w", dir, err)
		}
		c.dirs = append(c.dirs, dir)
		if slices.Contains(m.controllers, "cpuset") {
			// A v1 cpuset cgroup starts with no CPUs and no memory nodes:
			// nothing can run in it until they are copied from the parent.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				parent, err := os.ReadFile(filepath.Join(m.path, f))
				if err != nil {
					return nil, fmt.Errorf("cgroup %s: %w", dir, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
					return nil, fmt.Errorf("cgroup %s: %w", dir, err)
				}
			}
		}
		if m.v2 {
			// The kubelet's cgroups under this one need its controllers.
			controllers, err := os.ReadFile(filepath.Join(m.path, "cgroup.subtree_control"))
			if err == nil {
				var enable []string
				for _, ctrl := range strings.Fields(string(controllers)) {
					enable = append(enable, "+"+ctrl)
				}
				_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644)
			}
		}
	}
	return c, nil
}

// remove deletes the cgroup and what the kubelet made under it, deepest
// first; cgroups still in use stay.
func (c *cgroupRoot) remove() {
	for _, dir := range c.dirs {
		var dirs []string
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

type cgroupMount struct {
	path        string
	controllers []string
	v2          bool
}

// cgroupMounts are the mounted cgroup hierarchies: v1 controllers and the
// v2 unified one.
func cgroupMounts() ([]cgroupMount, error) {
	ms, err := mounts()
	if err != nil {
		return nil, err
	}
	return cgroupMountsOf(ms), nil
}

func cgroupMountsOf(ms []mount) []cgroupMount {
	var out []cgroupMount
	for _, m := range ms {
		switch m.fstype {
		case "cgroup":
			var controllers []string
			for _, opt := range strings.Split(m.superOptions, ",") {
				if !slices.Contains([]string{"rw", "ro", "xattr", "noprefix", "clone_children", "cpuset_v2_mode"}, opt) && !strings.Contains(opt, "=") {
					controllers = append(controllers, opt)
				}
			}
			out = append(out, cgroupMount{path: m.point, controllers: controllers})
		case "cgroup2":
			out = append(out, cgroupMount{path: m.point, v2: true})
		}
	}
	return out
}
