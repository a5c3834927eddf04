package linux

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
)

// watchBufferSize is the socket receive buffer asked for, so that a burst
// of changes (many Networks at once) does not overflow it: an overflow
// ends the watch and makes the caller restart it.
const watchBufferSize = 1 << 20

// subscriptionError keeps the last error a subscription reported, which
// explains why its channel was closed.
type subscriptionError struct {
	logger klog.Logger
	ctx    context.Context
	what   string
	last   atomic.Pointer[error]
}

func (s *subscriptionError) record(err error) {
	if s.ctx.Err() != nil {
		return // the socket was closed because we are done
	}
	s.last.Store(&err)
	s.logger.V(2).Info("Netlink subscription reported an error", "subscription", s.what, "err", err)
}

func (s *subscriptionError) ended() error {
	if s.ctx.Err() != nil {
		return nil
	}
	if p := s.last.Load(); p != nil {
		return fmt.Errorf("%s subscription ended: %w", s.what, *p)
	}
	return fmt.Errorf("%s subscription ended", s.what)
}

// WatchDrift calls changed with the owner of every netop bridge that
// changes or disappears, until ctx is done. Changes netop makes itself are
// reported too; the resulting Ensure is a no-op. changed should not block
// (enqueue and return): while it runs, events queue up in the kernel, and
// if they overflow the watch ends with an error.
func (b *Backend) WatchDrift(ctx context.Context, changed func(backend.Owner)) error {
	logger := klog.FromContext(ctx).WithValues("netns", b.netnsName)
	done := make(chan struct{})
	linkCh := make(chan netlink.LinkUpdate, 64)
	addrCh := make(chan netlink.AddrUpdate, 64)
	linkErr := &subscriptionError{logger: logger, ctx: ctx, what: "link"}
	addrErr := &subscriptionError{logger: logger, ctx: ctx, what: "address"}
	var linkStarted, addrStarted bool
	defer func() {
		close(done)
		// A subscription goroutine may be blocked handing us an update;
		// it exits, closing its channel, once it sees its socket closed.
		if linkStarted {
			for range linkCh {
			}
		}
		if addrStarted {
			for range addrCh {
			}
		}
	}()

	ns := b.ns
	err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{
		Namespace:         &ns,
		ErrorCallback:     linkErr.record,
		ReceiveBufferSize: watchBufferSize,
	})
	if err != nil {
		return fmt.Errorf("subscribe to link changes: %w", err)
	}
	linkStarted = true
	err = netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{
		Namespace:         &ns,
		ErrorCallback:     addrErr.record,
		ReceiveBufferSize: watchBufferSize,
	})
	if err != nil {
		return fmt.Errorf("subscribe to address changes: %w", err)
	}
	addrStarted = true
	// The isolation rules are repaired where they are watched: they are
	// every Network's, not one owner's to enqueue.
	isolationCtx, stopIsolation := context.WithCancel(ctx)
	defer stopIsolation()
	isolationErr := make(chan error, 1)
	go func() { isolationErr <- b.watchIsolation(isolationCtx) }()
	logger.V(2).Info("Watching bridges and their isolation rules for drift")

	// Address updates carry only an interface index. Which indexes are
	// ours is learnt from link updates, or looked up once on a miss, so
	// that address churn on other interfaces costs no netlink round trip.
	type linkOwner struct {
		owner backend.Owner
		ours  bool
	}
	owners := map[int]linkOwner{}

	for {
		select {
		case <-ctx.Done():
			return nil

		case err := <-isolationErr:
			return err

		case u, ok := <-linkCh:
			if !ok {
				return linkErr.ended()
			}
			owner, ours := ownerOf(u.Link)
			index := int(u.Index)
			if u.Header.Type == unix.RTM_DELLINK {
				delete(owners, index)
			} else {
				owners[index] = linkOwner{owner: owner, ours: ours}
			}
			if ours {
				changed(owner)
			}

		case u, ok := <-addrCh:
			if !ok {
				return addrErr.ended()
			}
			lo, known := owners[u.LinkIndex]
			if !known {
				link, err := b.nl.LinkByIndex(u.LinkIndex)
				if err != nil {
					// Gone already: its deletion is reported by the link
					// subscription, if it was ours.
					if !isLinkNotFound(err) && !errors.Is(err, unix.ENODEV) {
						logger.V(2).Info("Cannot look up link of an address change", "index", u.LinkIndex, "err", err)
					}
					continue
				}
				lo.owner, lo.ours = ownerOf(link)
				owners[u.LinkIndex] = lo
			}
			if lo.ours {
				changed(lo.owner)
			}
		}
	}
}

// ownerOf is the owner recorded on link, if netop made it. The prefix check
// keeps other links' events cheap.
func ownerOf(link netlink.Link) (backend.Owner, bool) {
	if link == nil {
		return backend.Owner{}, false
	}
	alias := link.Attrs().Alias
	if !strings.HasPrefix(alias, backend.RecordPrefix) {
		return backend.Owner{}, false
	}
	return ParseAlias(alias)
}
