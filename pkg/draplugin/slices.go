package draplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mig"
)

// MIG slices made on demand (docs/mig.md, "DRA nodes"): a claim allocated a
// potential slice (a device whose id is mig.SliceID) gets the slice made at
// prepare, by the node agent's SliceMaker, and handed off as that MIG
// device; the claim's unprepare releases it. The claim is the slice's
// holder: its UID is the owner the agent records, and the claims prepared
// (the checkpoint) are what holds a slice.

// SliceMaker makes and releases the MIG slices of claims.
type SliceMaker interface {
	// Ensure makes the slice for the claim whose UID is the owner, or
	// finds the one made for it before (handoff.SliceMaker).
	handoff.SliceMaker
	// Release destroys the slices made for owner that no prepared claim
	// holds: called once the claim is unprepared.
	Release(ctx context.Context, owner types.UID)
}

// errSlice marks a prepare that failed making a slice: its Event has the
// reason handoff.ReasonMIGSliceFailed, as on the device-plugin path.
var errSlice = errors.New("the MIG slice the scheduler chose could not be made")

// makeSlice makes the slice id for claim and returns its MIG device, which
// the handoff of this prepare then sees under its own id. Called with p.mu
// held.
func (p *Plugin) makeSlice(ctx context.Context, claim types.UID, id string) (*v1alpha1.Device, error) {
	if p.cfg.Slices == nil {
		return nil, fmt.Errorf("%w: MIG slice %s: this node agent makes no MIG slices", errSlice, id)
	}
	// The claim holds the slice from now until the checkpoint says so or
	// the prepare fails: the agent's reconciliation, which does not wait
	// for the prepare, must not take it for unheld in between.
	p.heldMu.Lock()
	if p.pending == nil {
		p.pending = map[string]types.UID{}
	}
	p.pending[id] = claim
	p.heldMu.Unlock()
	d, err := p.cfg.Slices.Ensure(ctx, claim, id)
	if err != nil {
		return nil, fmt.Errorf("%w: MIG slice %s: %w", errSlice, id, err)
	}
	// A copy: the map is the plugin's, the device the maker's.
	made := d.DeepCopy()
	if p.devices == nil {
		p.devices = map[string]*v1alpha1.Device{}
	}
	p.devices[made.ID] = made
	return made, nil
}

// isSlice says whether id is a potential slice's.
func isSlice(id string) bool {
	_, _, _, ok := mig.ParseSliceID(id)
	return ok
}

// HeldBy lists the claims that hold device id (a resclass id, a slice's
// among them), by UID: those of the checkpoint, as of its last change, and
// the one a slice is being made for. What keeps a MIG slice made for a
// claim. It does not take the plugin's lock, which a prepare holds while
// the SliceMaker asks.
func (p *Plugin) HeldBy(id string) []types.UID {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	out := slices.Clone(p.held[id])
	if uid, ok := p.pending[id]; ok && !slices.Contains(out, uid) {
		out = append(out, uid)
	}
	return out
}

// CheckpointBelieved says whether the claims prepared before the agent's
// start are known: false when the checkpoint was set aside, and the slices
// made for those claims must then not be taken as unheld.
func (p *Plugin) CheckpointBelieved() bool { return !p.setAside }

// noteHeld publishes the holders of each device from the checkpoint; with
// p.mu held, after each change.
func (p *Plugin) noteHeld() {
	m := map[string][]types.UID{}
	for _, uid := range slices.Sorted(maps.Keys(p.cp.Claims)) {
		for _, d := range p.cp.Claims[uid].Devices {
			if !slices.Contains(m[d.ID], uid) {
				m[d.ID] = append(m[d.ID], uid)
			}
		}
	}
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	p.held = m
}

// settled ends the hold of the slices made during a prepare call: the
// checkpoint holds them now, or the claim was not prepared. With p.mu held.
func (p *Plugin) settled() {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	clear(p.pending)
}

// release lets the slice maker destroy the slices made for claims that are
// not prepared now. Called with p.mu held.
func (p *Plugin) release(ctx context.Context, claims []types.UID) {
	if p.cfg.Slices == nil {
		return
	}
	p.heldMu.Lock()
	maps.DeleteFunc(p.pending, func(_ string, uid types.UID) bool { return slices.Contains(claims, uid) })
	p.heldMu.Unlock()
	for _, uid := range claims {
		if _, prepared := p.cp.Claims[uid]; !prepared {
			p.cfg.Slices.Release(ctx, uid)
		}
	}
}
