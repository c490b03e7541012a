// Package hugepages discovers hugepage pools from sysfs and describes them as
// v1alpha1.Devices of kind huge-pages.
//
// A pool is the pages of one size on one NUMA node, as the kernel keeps them in
// /sys/devices/system/node/node<N>/hugepages/hugepages-<size>kB. Without per-node
// directories (no NUMA in sysfs, as in some containers and VMs) a pool is the
// pages of one size on the whole machine, from /sys/kernel/mm/hugepages.
//
// A pool's id is "hugepages-<size>-numa<N>", or "hugepages-<size>" without NUMA
// information, where <size> is written as the kubelet writes it in its native
// resource names (hugepages-2Mi, hugepages-1Gi). The kubelet stays the accountant
// of the pages themselves: see docs/hugepages.md.
package hugepages

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/discovery/sysfs"
)

// Options of a discovery.
type Options struct {
	// HostRoot is where the host's / is mounted ("/" on the node itself).
	HostRoot string
}

const (
	nodesDir  = "sys/devices/system/node"
	globalDir = "sys/kernel/mm/hugepages"
)

// Discover lists the hugepage pools under opts.HostRoot, sorted by id.
//
// A kernel without hugetlbfs has no hugepage directories: that is zero pools, not
// an error. A HostRoot that does not exist is an error, since it means the host's
// / is not mounted where the agent was told, and reporting zero pools would hide
// that. A pool whose counters cannot be read is listed unhealthy, with the reason.
func Discover(opts Options) ([]v1alpha1.Device, error) {
	root := opts.HostRoot
	if root == "" {
		root = "/"
	}
	if _, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("host root: %w", err)
	}
	out, numa, err := perNode(root)
	if err == nil && !numa {
		out, err = pools(root, globalDir, -1)
	}
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// perNode lists the pools of every NUMA node; numa is false when no node has a
// hugepages directory, and the caller then falls back to the machine-wide
// counters. Nodes without memory have no hugepages directory and no pools.
func perNode(root string) (out []v1alpha1.Device, numa bool, err error) {
	entries, err := os.ReadDir(filepath.Join(root, nodesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("listing NUMA nodes: %w", err)
	}
	for _, e := range entries {
		node, ok := parseNodeDir(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		dir := filepath.Join(nodesDir, e.Name(), "hugepages")
		if _, err := os.Stat(filepath.Join(root, dir)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		numa = true
		p, err := pools(root, dir, node)
		if err != nil {
			return nil, false, err
		}
		out = append(out, p...)
	}
	return out, numa, nil
}

// pools describes the pools of the hugepages-<size>kB directories in dir (relative
// to root); node is -1 when the pools are not per NUMA node.
func pools(root, dir string, node int64) ([]v1alpha1.Device, error) {
	entries, err := os.ReadDir(filepath.Join(root, dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing hugepage sizes: %w", err)
	}
	var out []v1alpha1.Device
	for _, e := range entries {
		bytes, ok := parsePageDir(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		out = append(out, describe(root, filepath.Join(dir, e.Name()), bytes, node))
	}
	return out, nil
}

func describe(root, dir string, bytes, node int64) v1alpha1.Device {
	d := v1alpha1.Device{
		ID:      poolID(bytes, node),
		Kind:    v1alpha1.DeviceKindHugePages,
		Healthy: true,
		Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeSize:         v1alpha1.QuantityAttribute(*resource.NewQuantity(bytes, resource.BinarySI)),
			v1alpha1.AttributeResourceName: v1alpha1.StringAttribute(corev1.ResourceHugePagesPrefix + sizeName(bytes)),
		},
	}
	if node >= 0 {
		d.Attributes[v1alpha1.AttributeNUMANode] = v1alpha1.IntAttribute(node)
	}
	var unreadable []string
	for _, c := range []struct{ file, attribute string }{
		{"nr_hugepages", v1alpha1.AttributePagesTotal},
		{"free_hugepages", v1alpha1.AttributePagesFree},
	} {
		n, ok := sysfs.ReadInt(filepath.Join(root, dir, c.file))
		if !ok || n < 0 {
			unreadable = append(unreadable, c.file)
			continue
		}
		d.Attributes[c.attribute] = v1alpha1.IntAttribute(n)
	}
	if unreadable != nil {
		// A pool we cannot count must not be handed out, but it must stay visible
		// so the operator sees why the node has fewer pools than sizes.
		d.Healthy = false
		d.Reason = fmt.Sprintf("cannot read %s in /%s", strings.Join(unreadable, ", "), filepath.ToSlash(dir))
	}
	return d
}

// poolID is the device id of the pool of pages of bytes on NUMA node node, or of the
// machine-wide pool when node is negative.
func poolID(bytes, node int64) string {
	id := corev1.ResourceHugePagesPrefix + sizeName(bytes)
	if node >= 0 {
		id += "-numa" + strconv.FormatInt(node, 10)
	}
	return id
}

// sizeName writes a page size as the kubelet does in its hugepages-<size>
// resource names (v1helper.HugePageResourceName of a BinarySI quantity): "2Mi",
// "1Gi".
func sizeName(bytes int64) string {
	return resource.NewQuantity(bytes, resource.BinarySI).String()
}

// parsePageDir reads the page size in bytes from a directory name the kernel
// writes as "hugepages-<kB>kB" (hugepages-2048kB). Only the kernel's own spelling
// is accepted: decimal digits without sign or leading zero, a positive size, and
// one that fits in an int64 once in bytes. So each size has one name and
// two names never give one pool id.
func parsePageDir(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, "hugepages-")
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, "kB"); !ok || s == "" || s[0] == '0' {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	kb, err := strconv.ParseInt(s, 10, 64)
	if err != nil || kb > (1<<63-1)/1024 {
		return 0, false
	}
	return kb * 1024, true
}

// parseNodeDir reads N from "node<N>", as the kernel writes it.
func parseNodeDir(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, "node")
	if !ok || s == "" || (s[0] == '0' && s != "0") {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 32)
	return n, err == nil
}
