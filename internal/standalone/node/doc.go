// Package node makes the standalone a real single-node Kubernetes: a
// private containerd, a kubelet and a pod network, all state under the
// data directory, all stopped with the standalone.
//
// The parts and why they are so:
//   - containerd is the host's (Debian's containerd and runc), run as a
//     child process with its own root, state, socket and configuration, so
//     that it never meets a containerd the host may run.
//   - The kubelet is the standalone binary itself, re-executed with the
//     subcommand "kubelet": a process of its own (it owns signal handling,
//     cgroups and global state the way kubelet expects), one command for
//     the user.
//   - Images come from a registry served in-process on loopback (the
//     go-containerregistry registry), which containerd uses as the mirror
//     of docker.io and registry.k8s.io: pause and busybox (Debian's
//     busybox-static) are built here, so "busybox" and
//     "docker.io/library/busybox:latest" resolve offline even with
//     imagePullPolicy Always, and other images fail with the usual
//     ImagePull errors.
//   - Pods' eth0 is the standard bridge plugin with host-local addresses,
//     its bridge in the standalone's network namespace (--netns) beside
//     netop's bridges, so that pods never touch the host's routes.
package node
