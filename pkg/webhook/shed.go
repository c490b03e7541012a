package webhook

import (
	"encoding/json"
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// inFlightLimit bounds the admission requests the server works on at once
// (--max-in-flight). Beyond it a request is answered at once with HTTP 429
// and a Status saying the webhook is overloaded, instead of being queued
// behind the others: a queued admission is answered late, past the
// webhook's timeoutSeconds, when the apiserver has given up on it anyway,
// and the queue's memory and collector work slow every answer behind it.
//
// 429 and not an AdmissionReview that denies: a non-2xx answer is a failed
// call to the apiserver, so the webhook's own failurePolicy decides. A
// fail-closed webhook (pods, classes, distributions) refuses the object with
// the Status's message, as it would if the webhook were down; the fail-open
// workloads webhook lets the workload through, its pods checked on creation.
// A denial would refuse workloads too. No Retry-After header: client-go would
// retry within the same timeout, adding load where there is too much.
type inFlightLimit struct {
	slots chan struct{}
}

// newInFlightLimit returns a limit of limit requests at once; <= 0: none.
func newInFlightLimit(limit int) *inFlightLimit {
	if limit <= 0 {
		return &inFlightLimit{}
	}
	return &inFlightLimit{slots: make(chan struct{}, limit)}
}

// overloadedMessage is what the user of a refused request reads, after the
// apiserver's `failed calling webhook "<name>":`.
func overloadedMessage(limit int) string {
	return fmt.Sprintf("the resclass webhook is overloaded (more than %d admission requests at once, --max-in-flight): "+
		"it answered at once instead of late; retry the request", limit)
}

// wrap returns next behind the limit, counting what it sheds under path.
func (l *inFlightLimit) wrap(path string, next http.Handler) http.Handler {
	if l.slots == nil {
		return next
	}
	status, err := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure,
		Message:  overloadedMessage(cap(l.slots)),
		Reason:   metav1.StatusReasonTooManyRequests,
		Code:     http.StatusTooManyRequests,
	})
	if err != nil {
		panic(err)
	}
	shed := shedRequests.WithLabelValues(path)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case l.slots <- struct{}{}:
		default:
			shed.Inc()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(status)
			return
		}
		inFlight.Inc()
		defer func() {
			inFlight.Dec()
			<-l.slots
		}()
		next.ServeHTTP(w, r)
	})
}
