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
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/testing/nettest"
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
// plugin's records under a standalone's data directory (node/cni/netop,
// and nodes/NAME/node/cni/netop with --nodes); ok is false while there is
// no record of it.
func Netns(dataDir, pod string) (ns netns.NsHandle, ok bool, err error) {
	var records []string
	for _, pattern := range []string{"*", "*/*", "*/*/*"} {
		found, _ := filepath.Glob(filepath.Join(dataDir, pattern, "cni", "netop", "*.json"))
		records = append(records, found...)
	}
	for _, path := range records {
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
			go nettest.AcceptAndClose(l)
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
			go nettest.EchoDatagrams(conn)
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

// Stream sends a numbered UDP datagram from one namespace to a UDP echo
// (Serve's) every interval, each from a new socket, and records which
// were answered: when a change of policy took effect on the path, to
// within an interval. Each datagram is a new flow: a policy that denies
// leaves established flows to conntrack, so one long flow would never see
// it. Source ports go round a range that takes minutes to come back to a
// port, longer than conntrack remembers a UDP flow (30 s): a random
// ephemeral port could be one of a flow from before the change.
type Stream struct {
	from     netns.NsHandle
	to       string
	interval time.Duration
	done     chan struct{}
	finished sync.WaitGroup

	mu       sync.Mutex
	sent     []time.Time
	answered []bool
}

// streamPorts are the source ports a Stream goes round.
var streamPorts = struct{ first, count int }{first: 20000, count: 40000}

// StartStream starts a Stream from the namespace from to addr:port.
func StartStream(from netns.NsHandle, addr string, port int, interval time.Duration) (*Stream, error) {
	s := &Stream{from: from, to: net.JoinHostPort(addr, strconv.Itoa(port)), interval: interval, done: make(chan struct{})}
	started := make(chan error, 1)
	s.finished.Go(func() { s.send(started) })
	if err := <-started; err != nil {
		return nil, fmt.Errorf("a UDP stream to %s: %w", s.to, err)
	}
	return s, nil
}

// send runs on a thread of its own in the namespace, so that each
// datagram's socket is made there without a switch; the thread is
// never unlocked, so Go discards it when send returns.
func (s *Stream) send(started chan<- error) {
	runtime.LockOSThread()
	if err := netns.Set(s.from); err != nil {
		started <- err
		return
	}
	started <- nil
	ticker := time.NewTicker(s.interval)
	defer ticker.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-ticker.C:
		}
		s.mu.Lock()
		seq := len(s.sent)
		s.mu.Unlock()
		dialer := net.Dialer{LocalAddr: &net.UDPAddr{Port: streamPorts.first + seq%streamPorts.count}}
		conn, err := dialer.Dial("udp4", s.to)
		s.mu.Lock()
		s.sent = append(s.sent, time.Now())
		s.answered = append(s.answered, false)
		s.mu.Unlock()
		if err != nil {
			continue
		}
		s.finished.Go(func() { s.await(conn, seq) })
	}
}

// await sends datagram seq on conn and records its answer.
func (s *Stream) await(conn net.Conn, seq int) {
	defer func() { _ = conn.Close() }()
	buf := make([]byte, 8)
	binary.BigEndian.PutUint64(buf, uint64(seq))
	_ = conn.SetDeadline(time.Now().Add(Timeout))
	if _, err := conn.Write(buf); err != nil {
		return
	}
	if n, err := conn.Read(buf); err != nil || n != 8 || binary.BigEndian.Uint64(buf) != uint64(seq) {
		return
	}
	s.mu.Lock()
	s.answered[seq] = true
	s.mu.Unlock()
}

// Close stops the stream.
func (s *Stream) Close() {
	close(s.done)
	s.finished.Wait()
}

// Opened reports the time from since to the sending of the first
// datagram after since that was answered; ok is false until one is.
func (s *Stream) Opened(since time.Time) (took time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, at := range s.sent {
		if !at.Before(since) && s.answered[i] {
			return at.Sub(since), true
		}
	}
	return 0, false
}

// Closed reports the time from since to the sending of the first datagram
// after since from which on none was answered; ok is false until the
// datagrams of the last quiet (longer than any answer takes) were all
// unanswered.
func (s *Stream) Closed(since time.Time, quiet time.Duration) (took time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := len(s.sent)
	for i, at := range s.sent {
		if !at.Before(since) {
			first = i
			break
		}
	}
	closedFrom := first
	for i := first; i < len(s.sent); i++ {
		if s.answered[i] {
			closedFrom = i + 1
		}
	}
	if closedFrom >= len(s.sent) || time.Since(s.sent[closedFrom]) < quiet {
		return 0, false
	}
	return s.sent[closedFrom].Sub(since), true
}

// DatagramArrives sends one UDP datagram of size bytes of payload, with
// the don't-fragment bit, from the namespace from to addr:port, a UDP echo
// (Serve's), and reports whether it was answered. err is the send's own:
// EMSGSIZE when the datagram does not fit the path's MTU, which the
// sender is told rather than the packet being lost.
func DatagramArrives(from netns.NsHandle, addr string, port, size int) (bool, error) {
	var conn net.Conn
	if err := linux.InNetns(from, func() (err error) {
		conn, err = net.Dial("udp4", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	}); err != nil {
		return false, err
	}
	defer func() { _ = conn.Close() }()
	raw, err := conn.(*net.UDPConn).SyscallConn()
	if err != nil {
		return false, err
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		sockErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}); err != nil || sockErr != nil {
		return false, errors.Join(err, sockErr)
	}
	_ = conn.SetDeadline(time.Now().Add(Timeout))
	if _, err := conn.Write(make([]byte, size)); err != nil {
		return false, err
	}
	_, err = conn.Read(make([]byte, 64))
	return err == nil, nil
}
