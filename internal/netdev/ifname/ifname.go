// Package ifname names the interfaces netop makes on a node: a Network's
// bridge and the host end of a pod's veth. Both names are derived, never
// stored, so a crash between making an interface and recording it never
// leads to a second one, and DEL finds the veth with nothing but the node.
//
// It stands apart from the linux backend so that the CNI plugin, which the
// runtime executes once per pod, names them without linking the backend.
package ifname

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

const (
	// BridgePrefix starts every bridge's name.
	BridgePrefix = "netop"
	// Size is IFNAMSIZ without the terminating NUL.
	Size = 15
	// BridgeUIDDigits: "netop" + 10 = 15 bytes. 40 bits of a random UUID
	// make a clash unlikely; if one happens the backend's alias check
	// refuses it.
	BridgeUIDDigits = Size - len(BridgePrefix)
)

// Bridge returns the name of the bridge of the Network with this UID:
// "netop" and the first ten hex digits of the UID.
func Bridge(uid types.UID) string {
	var b [Size]byte
	n := copy(b[:], BridgePrefix)
	for i := 0; i < len(uid) && n < len(b); i++ {
		c := uid[i]
		switch {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		case 'A' <= c && c <= 'F':
			c += 'a' - 'A'
		default:
			continue // dashes, and anything else that is no interface name
		}
		b[n] = c
		n++
	}
	return string(b[:n])
}

// HostVeth is the host end's name for a container's interface: the same
// on ADD and DEL, at most Size bytes.
func HostVeth(containerID, iface string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + iface))
	return hostVethPrefix + hex.EncodeToString(sum[:])[:Size-len(hostVethPrefix)]
}

// IsHostVeth reports whether name is one HostVeth makes. GC of the ends no
// record knows rests on it: nothing else on a node may match.
func IsHostVeth(name string) bool {
	if len(name) != Size || name[:len(hostVethPrefix)] != hostVethPrefix {
		return false
	}
	return strings.Trim(name[len(hostVethPrefix):], "0123456789abcdef") == ""
}

const hostVethPrefix = "nv"
