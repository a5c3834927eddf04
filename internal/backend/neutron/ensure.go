package neutron

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
)

// Ensure converges the network of want.Owner. When recorded names a network
// that is still owner's, a network that matches costs two requests: the
// network and its subnets.
func (b *Backend) Ensure(ctx context.Context, want backend.Network, recorded *backend.Ref) (backend.Result, error) {
	res := backend.Result{Status: backend.Ref{Type: backend.TypeNeutron}}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if err := validNetwork(want); err != nil {
		return res, err
	}
	logger := klog.FromContext(ctx).WithValues("owner", klog.KRef(want.Namespace, want.Name), "uid", want.UID)

	net, err := b.findNetwork(ctx, logger, want.Owner, recorded)
	if err != nil {
		return res, err
	}
	if net == nil {
		if net, err = b.createNetwork(ctx, want.Owner); err != nil {
			return res, err
		}
		res.Action = backend.ActionCreated
		logger.Info("Created network", "network", net.ID, "name", net.Name)
	}
	res.Status.NetworkID = net.ID
	logger = logger.WithValues("network", net.ID)

	changed := false
	if tags := Tags(want.Owner); !hasTags(net.Tags, tags) {
		if err := b.replaceTags(ctx, "networks", net.ID, mergeTags(net.Tags, tags)); err != nil {
			return res, err
		}
		changed = true
		logger.V(2).Info("Tagged network")
	}

	var subs []subnets.Subnet
	// The network lists its subnets' IDs: one without any, such as one just
	// created, needs no request to list them.
	if len(net.Subnets) > 0 {
		if subs, err = b.listSubnets(ctx, subnets.ListOpts{NetworkID: net.ID}); err != nil {
			return res, wrap(err, "list subnets of network %s", net.ID)
		}
	}
	var recordedSubnets []string
	if recorded != nil && recorded.NetworkID == net.ID {
		recordedSubnets = recorded.SubnetIDs
	}
	subnetIDs, subnetChanged, err := b.convergeSubnets(ctx, logger, want, net.ID, subs, recordedSubnets)
	res.Status.SubnetIDs = subnetIDs
	if (changed || subnetChanged) && res.Action == backend.ActionNone {
		res.Action = backend.ActionUpdated
	}
	if err != nil {
		return res, err
	}
	if res.Action == backend.ActionNone {
		logger.V(5).Info("Network is up to date")
	}
	return res, nil
}

// findNetwork returns owner's network: the recorded one if it is still
// owner's, else the one its tags or description say is owner's (made by a
// netop that died before recording it), else nil.
func (b *Backend) findNetwork(ctx context.Context, logger klog.Logger, owner backend.Owner, recorded *backend.Ref) (*networks.Network, error) {
	if recorded != nil && recorded.NetworkID != "" {
		n, err := networks.Get(ctx, b.client, recorded.NetworkID).Extract()
		switch {
		case err == nil && b.owned(n.Tags, n.Description, n.ProjectID, owner):
			return n, nil
		case err == nil:
			logger.Info("Recorded network is not this Network's; leaving it alone", "recorded", recorded.NetworkID)
		case isNotFound(err):
			logger.Info("Recorded network is gone", "recorded", recorded.NetworkID)
		default:
			return nil, wrap(err, "get network %s", recorded.NetworkID)
		}
	}
	found, err := b.lookup(ctx, owner)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	// Two networks of one owner only come from two netops racing; keep
	// the first made, so that all agree, and remove the others.
	slices.SortFunc(found, func(x, y networks.Network) int {
		return cmp.Or(x.CreatedAt.Compare(y.CreatedAt), cmp.Compare(x.ID, y.ID))
	})
	for _, dup := range found[1:] {
		if err := b.deleteNetwork(ctx, dup.ID); err != nil {
			logger.Error(err, "Could not delete a duplicate network", "duplicate", dup.ID)
			continue
		}
		logger.Info("Deleted a duplicate network", "duplicate", dup.ID)
	}
	n := found[0]
	logger.Info("Adopting network", "network", n.ID)
	return &n, nil
}

// lookup returns the networks that are owner's. The description covers a
// network whose tags were never set; the tags one whose description was
// edited, so both are tried, tags first.
func (b *Backend) lookup(ctx context.Context, owner backend.Owner) ([]networks.Network, error) {
	var found []networks.Network
	searches := []networks.ListOpts{
		{Tags: TagUIDPrefix + string(owner.UID), ProjectID: b.project},
		{Description: Description(owner), ProjectID: b.project},
	}
	if owner.Cluster != "" {
		// Made untagged before clusters were recorded.
		legacy := owner
		legacy.Cluster = ""
		searches = append(searches, networks.ListOpts{Description: Description(legacy), ProjectID: b.project})
	}
	for _, opts := range searches {
		nets, err := b.listNetworks(ctx, opts)
		if err != nil {
			return nil, wrap(err, "look up the network of %s/%s (UID %s)", owner.Namespace, owner.Name, owner.UID)
		}
		for _, n := range nets {
			if b.owned(n.Tags, n.Description, n.ProjectID, owner) {
				found = append(found, n)
			}
		}
		if len(found) > 0 {
			return found, nil
		}
	}
	return nil, nil
}

// owned reports whether a network or subnet in the project is owner's: its
// UID, and its cluster or none recorded (which owner adopts).
func (b *Backend) owned(tags []string, description, project string, owner backend.Owner) bool {
	rec, ok := recordOf(tags, description)
	return ok && owner.Claims(rec) && (b.project == "" || project == b.project)
}

func (b *Backend) createNetwork(ctx context.Context, owner backend.Owner) (*networks.Network, error) {
	up := true
	n, err := networks.Create(ctx, b.client, networks.CreateOpts{
		Name:         NetworkName(owner),
		Description:  Description(owner),
		ProjectID:    b.project,
		AdminStateUp: &up,
	}).Extract()
	if err != nil {
		return nil, wrap(err, "create network for %s/%s", owner.Namespace, owner.Name)
	}
	return n, nil
}

// convergeSubnets makes subs, the subnets of network netID, exactly one
// subnet per family of want, and returns their IDs, in the order of the
// families, and whether anything changed. Of several subnets of one
// family's CIDR, a recorded one is kept.
func (b *Backend) convergeSubnets(ctx context.Context, logger klog.Logger, want backend.Network, netID string, subs []subnets.Subnet, recorded []string) ([]string, bool, error) {
	families := want.Families
	keep := make([]*subnets.Subnet, len(families))
	var others []*subnets.Subnet
	for i := range subs {
		s := &subs[i]
		p, _, err := parseSubnet(s)
		j := slices.IndexFunc(families, func(f backend.Family) bool { return err == nil && f.CIDR == p })
		if j >= 0 && (keep[j] == nil || slices.Contains(recorded, s.ID)) {
			if keep[j] != nil {
				others = append(others, keep[j])
			}
			keep[j] = s
			continue
		}
		others = append(others, s)
	}

	changed := false
	created := make([]bool, len(families))
	for j, f := range families {
		if keep[j] != nil {
			continue
		}
		// A subnet's CIDR cannot be changed, so a new CIDR is a new
		// subnet. Neutron refuses overlapping subnets in one network:
		// those are deleted first, the others only once the new one
		// exists.
		var later []*subnets.Subnet
		for _, s := range others {
			if p, _, err := parseSubnet(s); err == nil && !p.Overlaps(f.CIDR) {
				later = append(later, s)
				continue
			}
			if err := b.deleteSubnet(ctx, logger, s); err != nil {
				return ids(keep), changed, err
			}
			changed = true
		}
		others = later
		s, err := b.createSubnet(ctx, want.Owner, f, netID)
		if err != nil {
			return ids(keep), changed, err
		}
		keep[j], changed, created[j] = s, true, true
		logger.Info("Created subnet", "subnet", s.ID, "cidr", s.CIDR, "gateway", s.GatewayIP)
	}
	for _, s := range others {
		if err := b.deleteSubnet(ctx, logger, s); err != nil {
			return ids(keep), changed, err
		}
		changed = true
	}

	for j, f := range families {
		s := keep[j]
		if !created[j] {
			pools := allocationPools(f.CIDR, f.Gateway)
			_, gw, err := parseSubnet(s)
			// With no pools to ask for (/31, /32), Neutron's are as good.
			if err != nil || gw != f.Gateway || (len(pools) > 0 && !samePools(s.AllocationPools, pools)) {
				gateway := f.Gateway.String()
				// The pools go with the gateway: Neutron refuses a
				// gateway inside the pools, and the old gateway belongs in
				// them now.
				_, err := subnets.Update(ctx, b.client, s.ID, subnets.UpdateOpts{
					GatewayIP:       &gateway,
					AllocationPools: toNeutronPools(pools),
				}).Extract()
				if err != nil {
					return ids(keep), changed, wrap(err, "update gateway of subnet %s from %s to %s", s.ID, s.GatewayIP, gateway)
				}
				changed = true
				logger.Info("Updated subnet", "subnet", s.ID, "oldGateway", s.GatewayIP, "gateway", gateway)
			}
		}
		if tags := Tags(want.Owner); !hasTags(s.Tags, tags) {
			if err := b.replaceTags(ctx, "subnets", s.ID, mergeTags(s.Tags, tags)); err != nil {
				return ids(keep), changed, err
			}
			changed = true
		}
	}
	return ids(keep), changed, nil
}

// ids are the IDs of subs, up to the first nil.
func ids(subs []*subnets.Subnet) []string {
	var out []string
	for _, s := range subs {
		if s == nil {
			break
		}
		out = append(out, s.ID)
	}
	return out
}

func (b *Backend) createSubnet(ctx context.Context, owner backend.Owner, f backend.Family, netID string) (*subnets.Subnet, error) {
	gateway := f.Gateway.String()
	dhcp := false // no DHCP agents are assumed; addresses come from Neutron's IPAM
	version := gophercloud.IPv4
	if f.CIDR.Addr().Is6() {
		version = gophercloud.IPv6
	}
	s, err := subnets.Create(ctx, b.client, subnets.CreateOpts{
		NetworkID:       netID,
		Name:            NetworkName(owner),
		Description:     Description(owner),
		ProjectID:       b.project,
		CIDR:            f.CIDR.String(),
		IPVersion:       version,
		GatewayIP:       &gateway,
		AllocationPools: toNeutronPools(allocationPools(f.CIDR, f.Gateway)),
		EnableDHCP:      &dhcp,
	}).Extract()
	if err != nil {
		return nil, wrap(err, "create subnet %s with gateway %s in network %s", f.CIDR, gateway, netID)
	}
	return s, nil
}

func (b *Backend) deleteSubnet(ctx context.Context, logger klog.Logger, s *subnets.Subnet) error {
	err := subnets.Delete(ctx, b.client, s.ID).ExtractErr()
	if err != nil && !isNotFound(err) {
		return wrap(err, "delete subnet %s (%s)", s.ID, s.CIDR)
	}
	logger.Info("Deleted subnet", "subnet", s.ID, "cidr", s.CIDR)
	return nil
}

// replaceTags sets all tags of a resource in one request; Neutron has no
// way to add several at once otherwise.
func (b *Backend) replaceTags(ctx context.Context, kind, id string, tags []string) error {
	_, err := attributestags.ReplaceAll(ctx, b.client, kind, id, attributestags.ReplaceAllOpts{Tags: tags}).Extract()
	return wrap(err, "tag %s %s", kind, id)
}

// Delete removes owner's network with its subnets: the recorded one and any
// other that is owner's. A network that is not owner's is never deleted.
func (b *Backend) Delete(ctx context.Context, owner backend.Owner, recorded *backend.Ref) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !validUID(owner.UID) {
		return fmt.Errorf("invalid UID %q", owner.UID)
	}
	logger := klog.FromContext(ctx).WithValues("owner", klog.KRef(owner.Namespace, owner.Name), "uid", owner.UID)

	var ids []string
	if recorded != nil && recorded.NetworkID != "" {
		n, err := networks.Get(ctx, b.client, recorded.NetworkID).Extract()
		switch {
		case err == nil && b.owned(n.Tags, n.Description, n.ProjectID, owner):
			ids = append(ids, n.ID)
		case err == nil:
			logger.Info("Not deleting the recorded network: it is not this Network's", "network", n.ID)
		case isNotFound(err):
		default:
			return wrap(err, "get network %s", recorded.NetworkID)
		}
	}
	// Also what a netop that died before recording it made.
	found, err := b.lookup(ctx, owner)
	if err != nil {
		return err
	}
	for _, n := range found {
		if !slices.Contains(ids, n.ID) {
			ids = append(ids, n.ID)
		}
	}
	for _, id := range ids {
		if err := b.deleteNetwork(ctx, id); err != nil {
			return err
		}
		logger.Info("Deleted network", "network", id)
	}
	return nil
}

// deleteNetwork deletes a network and, with it, its subnets.
func (b *Backend) deleteNetwork(ctx context.Context, id string) error {
	err := networks.Delete(ctx, b.client, id).ExtractErr()
	if err != nil && !isNotFound(err) {
		return wrap(err, "delete network %s", id)
	}
	return nil
}

// ListOwned lists netop's networks in the project with two requests (more
// only if Neutron pages the answers): the networks tagged as netop's and
// the subnets tagged as netop's.
// InUse is false: Neutron's ports are Neutron's to keep, not the node's.
func (b *Backend) InUse(context.Context, backend.Owner) (bool, error) { return false, nil }

func (b *Backend) ListOwned(ctx context.Context) ([]backend.Observed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	nets, err := b.listNetworks(ctx, networks.ListOpts{Tags: TagOwned, ProjectID: b.project})
	if err != nil {
		return nil, wrap(err, "list netop's networks")
	}
	if len(nets) == 0 {
		return nil, nil
	}
	subs, err := b.listSubnets(ctx, subnets.ListOpts{Tags: TagOwned, ProjectID: b.project})
	if err != nil {
		return nil, wrap(err, "list netop's subnets")
	}
	byID := make(map[string]*subnets.Subnet, len(subs))
	for i := range subs {
		byID[subs[i].ID] = &subs[i]
	}

	observed := make([]backend.Observed, 0, len(nets))
	for _, n := range nets {
		owner, ok := recordOf(n.Tags, "")
		if !ok || owner.UID == "" {
			continue // tagged "netop" by someone, but not by netop
		}
		if o, ok := ParseDescription(n.Description); ok && o.UID == owner.UID && (owner.Cluster == "" || o.Cluster == owner.Cluster) {
			owner.Namespace, owner.Name = o.Namespace, o.Name
			if owner.Cluster == "" {
				owner.Cluster = o.Cluster
			}
		}
		obs := backend.Observed{
			Owner:  owner,
			Status: backend.Ref{Type: backend.TypeNeutron, NetworkID: n.ID},
		}
		// A network without subnets, with several of one IP family, or
		// with one untagged (which Ensure then tags) is left without
		// families, so that it differs from every spec and is repaired.
		// The subnets are in Neutron's order: which is the primary is the
		// spec's to say (backend.SameStatus compares them as a set).
		obs.Status.SubnetIDs = slices.Clone(n.Subnets)
		obs.Families = subnetFamilies(n.Subnets, byID)
		observed = append(observed, obs)
	}
	return observed, nil
}

// subnetFamilies are what the subnets of a network provide, one family per
// subnet, or nil where they are ambiguous or not all netop's.
func subnetFamilies(subnetIDs []string, byID map[string]*subnets.Subnet) []backend.Family {
	var families []backend.Family
	for _, id := range subnetIDs {
		s := byID[id]
		if s == nil {
			return nil
		}
		p, gw, err := parseSubnet(s)
		if err != nil || !p.Contains(gw) || slices.ContainsFunc(families, func(f backend.Family) bool { return f.CIDR.Addr().Is4() == p.Addr().Is4() }) {
			return nil
		}
		families = append(families, backend.Family{CIDR: p, Gateway: gw})
	}
	return families
}

// listNetworks returns every page of a network list.
func (b *Backend) listNetworks(ctx context.Context, opts networks.ListOpts) ([]networks.Network, error) {
	pages, err := networks.List(b.client, opts).AllPages(ctx)
	if err != nil {
		return nil, err
	}
	nets, err := networks.ExtractNetworks(pages)
	if err != nil {
		return nil, fmt.Errorf("decode networks: %w", err)
	}
	return nets, nil
}

// listSubnets returns every page of a subnet list.
func (b *Backend) listSubnets(ctx context.Context, opts subnets.ListOpts) ([]subnets.Subnet, error) {
	pages, err := subnets.List(b.client, opts).AllPages(ctx)
	if err != nil {
		return nil, err
	}
	subs, err := subnets.ExtractSubnets(pages)
	if err != nil {
		return nil, fmt.Errorf("decode subnets: %w", err)
	}
	return subs, nil
}
