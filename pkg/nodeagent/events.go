package nodeagent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// events records the agent's Events and writes every one recorded before the
// agent stops. client-go's broadcaster writes asynchronously and, once shut
// down (or its context ends), drops what it has not written yet: an agent
// stopped by SIGTERM right after a GPU failed would lose the DeviceUnhealthy
// Event, which is the one an operator looks for. So the broadcaster here runs
// on its own until flush, and flush records a marker after everything else
// and waits for it to reach the sink: the broadcaster writes in order, one at
// a time, so everything before the marker has been written (or given up on
// after its retries) by then.
type events struct {
	record.EventRecorder
	broadcaster record.EventBroadcaster
	marker      types.UID
	flushed     chan struct{}
}

func newEvents(ctx context.Context, kube kubernetes.Interface, node string) *events {
	e := &events{
		// ctx's logger, not its end: that would cut the writes short.
		broadcaster: record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx))),
		marker:      uuid.NewUUID(),
		flushed:     make(chan struct{}),
	}
	e.broadcaster.StartRecordingToSink(&markerSink{
		EventSink: &typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")},
		events:    e,
	})
	e.EventRecorder = e.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "resclass-node-agent", Host: node})
	return e
}

// flush waits until every Event recorded so far has been written, at most
// timeout, and stops the broadcaster. Nothing may be recorded after it.
func (e *events) flush(ctx context.Context, timeout time.Duration) {
	logger := klog.FromContext(ctx)
	// The marker's object is its own (a fresh UID), so the correlator neither
	// aggregates it nor rate-limits it with the Node's Events.
	e.Event(&corev1.ObjectReference{Kind: "Node", Name: "flush", UID: e.marker, APIVersion: "v1"}, corev1.EventTypeNormal, "Flush", "flush")
	select {
	case <-e.flushed:
		logger.V(2).Info("events flushed")
	case <-time.After(timeout):
		logger.Info("events not all written before the shutdown timeout", "timeout", timeout)
	}
	e.broadcaster.Shutdown()
}

// markerSink is the apiserver's Event sink, but the marker stops at it.
type markerSink struct {
	record.EventSink
	events *events
}

func (s *markerSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	if ev.InvolvedObject.UID == s.events.marker {
		close(s.events.flushed)
		return ev, nil
	}
	return s.EventSink.Create(ev)
}
