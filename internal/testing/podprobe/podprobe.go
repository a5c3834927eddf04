// Package podprobe finds the network namespaces of pods a node attached
// and probes, from inside them, which pods reach which ports of others:
// the reachability checks of the network-policy suites and benchmarks.
// Servers and probes are the test's own sockets in the pods' namespaces,
// not processes in the pods' containers: busybox's nc has no UDP, and its
// TCP server, a process per connection with a backlog of one, drops a
// matrix's bursts of connections.
package podprobe

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni"
)

// Protocols of a Port, as NetworkPolicy names them in lower case.
const (
	TCP  = "tcp"
	UDP  = "udp"
	SCTP = "sctp"
)

// Port is a probed port.
type Port struct {
	Number   int
	Protocol string
}

func (p Port) String() string { return strconv.Itoa(p.Number) + "/" + p.Protocol }

// Timeout bounds one probe: a refused port (dropped packets) costs this
// much.
const Timeout = 400 * time.Millisecond

// Netns opens the network namespace of pod (namespace/name) from the CNI
// plugin's records under a standalone's data directory (those of its
// nodes, one level deeper with --nodes, too); ok is false while there is
// no record of it.
func Netns(dataDir, pod string) (ns netns.NsHandle, ok bool, err error) {
	records, _ := filepath.Glob(filepath.Join(dataDir, "*", "cni", "netop", "*.json"))
	more, _ := filepath.Glob(filepath.Join(dataDir, "*", "*", "cni", "netop", "*.json"))
	for _, path := range append(records, more...) {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var r cni.Record
		if json.Unmarshal(data, &r) == nil && r.Pod == pod {
			ns, err := netns.GetFromPath(r.Netns)
			if err != nil {
				return 0, false, fmt.Errorf("pod %s's network namespace: %w", pod, err)
			}
			return ns, true, nil
		}
	}
	return 0, false, nil
}

// Serve listens in ns on each port until close: TCP accepts, UDP echoes.
// SCTP needs no server: a probe watches for its packet in the target's
// namespace (this kernel has no SCTP stack, so nothing could accept).
func Serve(ns netns.NsHandle, ports []Port) (close func(), err error) {
	var closers []func() error
	close = func() {
		for _, c := range closers {
			_ = c()
		}
	}
	for _, port := range ports {
		switch port.Protocol {
		case TCP:
			var l net.Listener
			if err := linux.InNetns(ns, func() (err error) {
				l, err = net.Listen("tcp4", ":"+strconv.Itoa(port.Number))
				return err
			}); err != nil {
				close()
				return nil, fmt.Errorf("listening on %s: %w", port, err)
			}
			closers = append(closers, l.Close)
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					_ = c.Close()
				}
			}()
		case UDP:
			var conn net.PacketConn
			if err := linux.InNetns(ns, func() (err error) {
				conn, err = net.ListenPacket("udp4", ":"+strconv.Itoa(port.Number))
				return err
			}); err != nil {
				close()
				return nil, fmt.Errorf("listening on %s: %w", port, err)
			}
			closers = append(closers, conn.Close)
			go func() {
				buf := make([]byte, 64)
				for {
					n, from, err := conn.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = conn.WriteTo(buf[:n], from)
				}
			}()
		}
	}
	return close, nil
}

// Reaches reports whether a packet from the namespace from gets to port
// of addr (IPv4), in the namespace to: a TCP connection, a UDP answer, an
// SCTP INIT seen arriving.
func Reaches(from, to netns.NsHandle, addr string, port Port) bool {
	switch port.Protocol {
	case SCTP:
		return sctpArrives(from, to, addr, port.Number)
	case UDP:
		return dial(from, "udp4", addr, port.Number, func(conn net.Conn) bool {
			if _, err := conn.Write([]byte("x")); err != nil {
				return false
			}
			_, err := conn.Read(make([]byte, 8))
			return err == nil
		})
	default:
		return dial(from, "tcp4", addr, port.Number, func(net.Conn) bool { return true })
	}
}

func dial(from netns.NsHandle, network, addr string, port int, then func(net.Conn) bool) bool {
	var conn net.Conn
	if err := linux.InNetns(from, func() (err error) {
		conn, err = net.DialTimeout(network, net.JoinHostPort(addr, strconv.Itoa(port)), Timeout)
		return err
	}); err != nil {
		return false
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(Timeout))
	return then(conn)
}

// sctpSourcePorts tell concurrent probes' packets apart.
var sctpSourcePorts atomic.Uint32

// sctpArrives sends an SCTP INIT (what opens an association, so conntrack
// sees a new flow) from a raw socket in from and waits for it on a raw
// socket in to.
func sctpArrives(from, to netns.NsHandle, addr string, port int) bool {
	dst := net.ParseIP(addr)
	var watch net.PacketConn
	if err := linux.InNetns(to, func() (err error) {
		watch, err = net.ListenPacket("ip4:"+strconv.Itoa(unix.IPPROTO_SCTP), "0.0.0.0")
		return err
	}); err != nil {
		return false
	}
	defer func() { _ = watch.Close() }()
	source := uint16(20000 + sctpSourcePorts.Add(1)%40000)
	var send net.Conn
	if err := linux.InNetns(from, func() (err error) {
		send, err = net.DialIP("ip4:"+strconv.Itoa(unix.IPPROTO_SCTP), nil, &net.IPAddr{IP: dst})
		return err
	}); err != nil {
		return false
	}
	defer func() { _ = send.Close() }()
	if _, err := send.Write(sctpInit(source, uint16(port))); err != nil {
		return false
	}
	deadline := time.Now().Add(Timeout)
	_ = watch.SetReadDeadline(deadline)
	buf := make([]byte, 1500)
	for {
		n, _, err := watch.ReadFrom(buf)
		if err != nil {
			return false
		}
		if n >= 4 && binary.BigEndian.Uint16(buf[0:]) == source && binary.BigEndian.Uint16(buf[2:]) == uint16(port) {
			return true
		}
	}
}

// sctpInit is an SCTP packet of one INIT chunk (RFC 9260 §3): the common
// header with verification tag 0, as an INIT requires, and a CRC32c
// checksum, which conntrack verifies.
func sctpInit(source, dest uint16) []byte {
	p := make([]byte, 12+20)
	binary.BigEndian.PutUint16(p[0:], source)
	binary.BigEndian.PutUint16(p[2:], dest)
	chunk := p[12:]
	chunk[0] = 1 // INIT
	binary.BigEndian.PutUint16(chunk[2:], 20)
	binary.BigEndian.PutUint32(chunk[4:], 0x6e65746f) // initiate tag
	binary.BigEndian.PutUint32(chunk[8:], 65536)      // a_rwnd
	binary.BigEndian.PutUint16(chunk[12:], 1)         // outbound streams
	binary.BigEndian.PutUint16(chunk[14:], 1)         // inbound streams
	binary.BigEndian.PutUint32(chunk[16:], 1)         // initial TSN
	// The CRC32c goes in as the little-endian word (RFC 9260 appendix B).
	binary.LittleEndian.PutUint32(p[8:], crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli)))
	return p
}
