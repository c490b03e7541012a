package mig

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// toAPI is t as the node agent publishes it, with instances.
func toAPI(t *Table, instances ...v1alpha1.MIGInstance) *v1alpha1.DeviceMIG {
	m := &v1alpha1.DeviceMIG{Instances: instances}
	for _, p := range t.Profiles {
		var placements []int32
		for _, s := range p.Starts {
			placements = append(placements, int32(s))
		}
		m.Profiles = append(m.Profiles, v1alpha1.MIGProfile{Name: p.Name, Slices: int32(p.Size), Compute: int32(p.Compute),
			Memory: *resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI), Multiprocessors: int32(p.Multiprocessors),
			Decoders: int32(p.Decoders), JPEGs: int32(p.JPEGs), OFAs: int32(p.OFAs), Placements: placements, Max: int32(p.Max)})
	}
	return m
}

func TestFromAPI(t *testing.T) {
	m := toAPI(H100_80GB, v1alpha1.MIGInstance{Profile: "3g.40gb", Start: 4}, v1alpha1.MIGInstance{Profile: "1g.10gb+me", Start: 0})
	slices.Reverse(m.Profiles) // any order in; Less order out
	g, err := FromAPI("H100", m)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(g.Instances()); got != "[1g.10gb+me@0 3g.40gb@4]" {
		t.Errorf("instances %s", got)
	}
	var creatable []string
	for i := range g.Table.Profiles {
		p := &g.Table.Profiles[i]
		creatable = append(creatable, fmt.Sprintf("%s:%d", p.Name, g.Creatable(p)))
	}
	// Slices 1-3 are free: three 1g.10gb, one 1g.20gb or 2g.20gb (at 2), no
	// second +me, nothing of 4 slices or more.
	if got, want := strings.Join(creatable, " "), "1g.10gb:3 1g.10gb+me:0 1g.20gb:1 2g.20gb:1 3g.40gb:0 4g.40gb:0 7g.80gb:0"; got != want {
		t.Errorf("creatable %s, want %s", got, want)
	}
	for _, bad := range []struct {
		what string
		m    *v1alpha1.DeviceMIG
	}{
		{"an instance of a profile not listed", toAPI(H100_80GB, v1alpha1.MIGInstance{Profile: "9g.1tb", Start: 0})},
		{"overlapping instances", toAPI(H100_80GB, v1alpha1.MIGInstance{Profile: "3g.40gb", Start: 4}, v1alpha1.MIGInstance{Profile: "2g.20gb", Start: 4})},
		{"a placement not aligned", func() *v1alpha1.DeviceMIG {
			m := toAPI(H100_80GB)
			m.Profiles[3].Placements = []int32{1}
			return m
		}()},
	} {
		if _, err := FromAPI("H100", bad.m); err == nil {
			t.Errorf("%s: accepted", bad.what)
		}
	}
}
