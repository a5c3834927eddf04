package netselect

import (
	"fmt"
	"slices"
)

// Change is how a running pod's interfaces follow an edit of its
// selection (hot-plug): the allocations it keeps, the selections it adds
// and the allocations it no longer asks for.
type Change struct {
	Kept    []Allocation
	Added   []Selection
	Removed []Allocation
}

// None says that the edit changes no interface.
func (c Change) None() bool { return len(c.Added) == 0 && len(c.Removed) == 0 }

// Diff matches selections against the interfaces a pod has (its active
// allocations), as Multus's dynamic networks do: an interface is kept
// while a selection names its Network and either its interface by name
// or no interface at all, so that removing one Network from the list does
// not rename the others. A selection kept by nothing is added: under the
// name it asks for, else its place's default (netN) if no interface of
// the pod has that name, else the lowest free netN. An interface the
// pod keeps is never renamed: asking for its Network under another name
// is an error, as is asking for a name another kept interface has.
func Diff(have []Allocation, selections []Selection) (Change, error) {
	active := Active(have)
	kept := make([]bool, len(active))
	match := make([]int, len(selections))
	for i := range match {
		match[i] = -1
	}
	network := func(s Selection) string { return s.Namespace + "/" + s.Name }
	named := map[string]bool{}
	for i, s := range selections {
		if !s.Named {
			continue
		}
		named[s.Interface] = true
		if j := slices.IndexFunc(active, func(a Allocation) bool { return a.Interface == s.Interface }); j >= 0 && active[j].Network == network(s) {
			kept[j], match[i] = true, j
		}
	}
	for i, s := range selections {
		if s.Named {
			continue
		}
		free := func(want func(Allocation) bool) int {
			for j, a := range active {
				if !kept[j] && a.Network == network(s) && want(a) {
					return j
				}
			}
			return -1
		}
		j := free(func(a Allocation) bool { return a.Interface == s.Interface })
		if j < 0 {
			j = free(func(Allocation) bool { return true })
		}
		if j >= 0 {
			kept[j], match[i] = true, j
		}
	}
	var c Change
	for j, a := range active {
		if kept[j] {
			c.Kept = append(c.Kept, a)
			continue
		}
		for i, s := range selections {
			if s.Named && match[i] < 0 && network(s) == a.Network {
				return Change{}, fmt.Errorf("%s[%d].interface: %q: the pod's interface on Network %s is %s, and a running pod's interface is not renamed (remove the Network from the list, then add it again)",
					NetworksAnnotation, i, s.Interface, a.Network, a.Interface)
			}
		}
		c.Removed = append(c.Removed, a)
	}
	taken := map[string]bool{}
	for _, a := range have {
		taken[a.Interface] = true
	}
	for i, s := range selections {
		if match[i] >= 0 {
			continue
		}
		if s.Named {
			if j := slices.IndexFunc(c.Kept, func(a Allocation) bool { return a.Interface == s.Interface }); j >= 0 {
				return Change{}, fmt.Errorf("%s[%d].interface: %q: the pod's interface on Network %s has that name", NetworksAnnotation, i, s.Interface, c.Kept[j].Network)
			}
		} else if taken[s.Interface] || named[s.Interface] {
			for n := 1; ; n++ {
				if name := fmt.Sprintf("net%d", n); !taken[name] && !named[name] {
					s.Interface = name
					break
				}
			}
		}
		taken[s.Interface] = true
		c.Added = append(c.Added, s)
	}
	return c, nil
}
