package node

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point, fstype, superOptions string
}

func mounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return parseMountinfo(f)
}

func parseMountinfo(mountinfo io.Reader) ([]mount, error) {
	var out []mount
	s := bufio.NewScanner(mountinfo)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		fields := strings.Fields(s.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, mount{point: fields[4], fstype: fields[sep+1], superOptions: fields[len(fields)-1]})
	}
	return out, s.Err()
}

// unmountUnder unmounts every mount point under dir, deepest first: what
// the kubelet (pod volumes) and containerd (root file systems, network
// namespaces) left.
func unmountUnder(dir string) error {
	ms, err := mounts()
	if err != nil {
		return err
	}
	var points []string
	for _, m := range ms {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			points = append(points, m.point)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var failed []string
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			failed = append(failed, p+": "+err.Error())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("unmounting %s", strings.Join(failed, "; "))
	}
	return nil
}
