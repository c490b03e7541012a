package mig

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

func TestFromAPI(t *testing.T) {
	m := H100_80GB.API(v1alpha1.MIGInstance{Profile: "3g.40gb", Start: 4}, v1alpha1.MIGInstance{Profile: "1g.10gb+me", Start: 0})
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
		{"an instance of a profile not listed", H100_80GB.API(v1alpha1.MIGInstance{Profile: "9g.1tb", Start: 0})},
		{"overlapping instances", H100_80GB.API(v1alpha1.MIGInstance{Profile: "3g.40gb", Start: 4}, v1alpha1.MIGInstance{Profile: "2g.20gb", Start: 4})},
		{"a placement not aligned", func() *v1alpha1.DeviceMIG {
			m := H100_80GB.API()
			m.Profiles[3].Placements = []int32{1}
			return m
		}()},
	} {
		if _, err := FromAPI("H100", bad.m); err == nil {
			t.Errorf("%s: accepted", bad.what)
		}
	}
}
