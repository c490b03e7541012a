package nodeagent

import (
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/introspection"
	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// introspectionSource is what `node-agent status` sees: the devices of the
// last discovery pass with the classes serving them, the allocator's records
// and the health changes (introspection.Source).
type introspectionSource struct {
	*introspection.HealthHub // fed by Agent.reportHealth

	mu sync.Mutex
	// rendered are the devices as the API returns them, made in update: the
	// agent's devices share Quantities with the published copy, and rendering
	// one writes to it (Quantity.String caches), so no request renders.
	rendered []*agentv1.Device
	plugins  *pluginSet // nil when no endpoints are served
}

func newIntrospectionSource() *introspectionSource {
	return &introspectionSource{HealthHub: introspection.NewHealthHub(0)}
}

// update records the devices of a pass. It runs in the agent's loop, the only
// goroutine that touches devices.
func (s *introspectionSource) update(devices []v1alpha1.Device, plugins *pluginSet) {
	rendered := make([]*agentv1.Device, 0, len(devices))
	for _, d := range devices {
		pd := &agentv1.Device{Id: d.ID, Kind: d.Kind, Healthy: d.Healthy, Reason: d.Reason, NumaNode: -1, Attributes: make(map[string]string, len(d.Attributes))}
		if n := d.Attributes[v1alpha1.AttributeNUMANode].IntValue; n != nil {
			pd.NumaNode = int32(*n)
		}
		for name, a := range d.Attributes {
			pd.Attributes[name] = a.String()
		}
		rendered = append(rendered, pd)
	}
	s.mu.Lock()
	s.rendered, s.plugins = rendered, plugins
	s.mu.Unlock()
}

// Devices implements introspection.Source.
func (s *introspectionSource) Devices() []*agentv1.Device {
	s.mu.Lock()
	rendered, plugins := s.rendered, s.plugins
	s.mu.Unlock()
	var classes map[string][]string
	if plugins != nil {
		classes = plugins.matcher.classesOf()
	}
	out := make([]*agentv1.Device, 0, len(rendered))
	for _, d := range rendered {
		c := proto.CloneOf(d)
		c.Classes = classes[d.GetId()]
		out = append(out, c)
	}
	return out
}

// Allocations implements introspection.Source.
func (s *introspectionSource) Allocations() []*agentv1.Allocation {
	s.mu.Lock()
	plugins := s.plugins
	s.mu.Unlock()
	if plugins == nil {
		return nil
	}
	records := plugins.allocator.Allocations()
	out := make([]*agentv1.Allocation, 0, len(records))
	for _, r := range records {
		outcome := "allocated"
		if r.Refused {
			outcome = "refused"
		}
		out = append(out, &agentv1.Allocation{
			PodNamespace: r.Namespace, PodName: r.Name, PodUid: string(r.PodUID), Container: r.Container,
			ClassName: r.Class, DeviceIds: r.Devices, Time: timestamppb.New(r.Time), Outcome: outcome, Message: r.Message, Share: r.Share,
		})
	}
	return out
}
