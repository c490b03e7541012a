package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/introspection"
	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

type statusOptions struct {
	socket  string
	output  string
	watch   bool
	timeout time.Duration
	now     func() time.Time // AGE column; time.Now but in tests
}

func newStatusCommand() *cobra.Command {
	o := statusOptions{now: time.Now}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Ask the node agent running on this node for its devices, allocations and device health",
		Long: `status asks the node agent running on this node, over its introspection
socket, what it discovered (each device, its health and the resource classes
that serve it) and which allocations it granted or refused. The socket is
root's only: run it as root on the node, or in the agent's pod.

  node-agent status                   devices and allocations, as tables
  node-agent status -o yaml           the same as YAML (or -o json)
  node-agent status --watch           device health as it changes, until Ctrl-C`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.socket, "socket", introspection.DefaultIntrospectionSocket, "the node agent's introspection socket")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	f.BoolVar(&o.watch, "watch", false, "print the health of every device, then each change as it happens, until interrupted")
	f.DurationVar(&o.timeout, "timeout", 5*time.Second, "how long to wait for the agent's answer (without --watch)")
	return cmd
}

func (o *statusOptions) run(ctx context.Context, out, errOut io.Writer) error {
	switch o.output {
	case "table", "json", "yaml":
	default:
		return fmt.Errorf("unknown output format %q: use table, json or yaml", o.output)
	}
	// The client connects lazily and would only say "Unavailable": a missing
	// socket deserves a clearer word.
	if _, err := os.Stat(o.socket); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s does not exist: %s", o.socket, o.notRunningHint())
	}
	client, conn, err := introspection.Dial(o.socket)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	if o.watch {
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return o.watchHealth(ctx, client, out, errOut)
	}

	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	devices, err := client.ListDevices(ctx, &agentv1.ListDevicesRequest{})
	if err != nil {
		return o.callError("listing devices", err)
	}
	allocations, err := client.ListAllocations(ctx, &agentv1.ListAllocationsRequest{})
	if err != nil {
		return o.callError("listing allocations", err)
	}
	if o.output == "table" {
		return printStatusTables(out, devices.GetDevices(), allocations.GetAllocations(), o.now())
	}
	return printStatusDocument(out, o.output, devices.GetDevices(), allocations.GetAllocations())
}

func (o *statusOptions) notRunningHint() string {
	return "is the node agent running on this node? it serves " + o.socket
}

// callError explains the errors a user can act on.
func (o *statusOptions) callError(what string, err error) error {
	switch status.Code(err) {
	case codes.Unavailable:
		msg := status.Convert(err).Message()
		if strings.Contains(msg, "permission denied") {
			return fmt.Errorf("%s: permission denied on %s: the socket is root's only, run status as root", what, o.socket)
		}
		return fmt.Errorf("%s: cannot reach the node agent (%s): %s", what, msg, o.notRunningHint())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: the node agent did not answer within %v (--timeout)", what, o.timeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// watchHealth prints the stream until ctx ends (Ctrl-C), which is success. A
// watch the agent cut off for falling behind starts over.
func (o *statusOptions) watchHealth(ctx context.Context, client agentv1.AgentClient, out, errOut io.Writer) error {
	// Lines are printed as events come, so the columns have fixed widths: a
	// time in RFC 3339, a GPU UUID ("GPU-" and 36), the longest kind.
	const watchLine = "%-25s  %-40s  %-10s  %s\n"
	if o.output == "table" {
		if _, err := fmt.Fprintf(out, watchLine, "TIME", "DEVICE", "KIND", "HEALTH"); err != nil {
			return err
		}
	}
	first := true
	for {
		stream, err := client.WatchHealth(ctx, &agentv1.WatchHealthRequest{})
		if err != nil {
			return o.callError("watching health", err)
		}
		for {
			ev, err := stream.Recv()
			if ctx.Err() != nil {
				return nil // interrupted
			}
			if err != nil {
				if status.Code(err) == codes.ResourceExhausted {
					_, _ = fmt.Fprintln(errOut, "the watch fell behind and was cut off by the agent; watching again from the current state")
					break
				}
				if errors.Is(err, io.EOF) {
					return errors.New("watching health: the node agent ended the stream")
				}
				return o.callError("watching health", err)
			}
			switch o.output {
			case "table":
				if _, err := fmt.Fprintf(out, watchLine, ev.GetTime().AsTime().Local().Format(time.RFC3339), ev.GetDeviceId(), ev.GetKind(), eventHealth(ev)); err != nil {
					return err
				}
			case "json":
				data, err := marshalProto(ev)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(out, "%s\n", data); err != nil { // JSON lines
					return err
				}
			case "yaml":
				data, err := marshalProto(ev)
				if err == nil {
					data, err = yaml.JSONToYAML(data)
				}
				if err != nil {
					return err
				}
				sep := "---\n"
				if first {
					sep = ""
				}
				if _, err := fmt.Fprintf(out, "%s%s", sep, data); err != nil {
					return err
				}
			}
			first = false
		}
	}
}

func health(healthy bool, reason string) string {
	if healthy {
		return "healthy"
	}
	if reason == "" {
		return "unhealthy"
	}
	return "unhealthy: " + reason
}

// eventHealth is health, but also says what a device recovered from: in a
// stream of changes, that is news.
func eventHealth(ev *agentv1.HealthEvent) string {
	if ev.GetHealthy() && ev.GetReason() != "" {
		return "healthy: " + ev.GetReason()
	}
	return health(ev.GetHealthy(), ev.GetReason())
}

func printStatusTables(w io.Writer, devices []*agentv1.Device, allocations []*agentv1.Allocation, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var err error
	line := func(format string, args ...any) {
		if err == nil {
			_, err = fmt.Fprintf(tw, format+"\n", args...)
		}
	}
	line("DEVICES")
	if len(devices) == 0 {
		line("(none discovered)")
	} else {
		line("ID\tKIND\tHEALTH\tNUMA\tCLASSES")
	}
	for _, d := range devices {
		numa := "-"
		if d.GetNumaNode() >= 0 {
			numa = fmt.Sprint(d.GetNumaNode())
		}
		classes := strings.Join(d.GetClasses(), ",")
		if classes == "" {
			classes = "<none>"
		}
		line("%s\t%s\t%s\t%s\t%s", d.GetId(), d.GetKind(), health(d.GetHealthy(), d.GetReason()), numa, classes)
	}
	// Two tables: a flush in between keeps their columns independent.
	if err == nil {
		err = tw.Flush()
	}
	line("")
	line("ALLOCATIONS")
	if len(allocations) == 0 {
		line("(none)")
	} else {
		line("POD\tCONTAINER\tCLASS\tDEVICES\tOUTCOME\tAGE")
	}
	for _, a := range allocations {
		devs := strings.Join(a.GetDeviceIds(), ",")
		if devs == "" {
			devs = "-"
		}
		if share := shareText(a.GetShare()); share != "" {
			devs += " (" + share + ")"
		}
		outcome := a.GetOutcome()
		if outcome != "allocated" && a.GetMessage() != "" {
			outcome += ": " + a.GetMessage()
		}
		age := "<unknown>"
		if a.GetTime() != nil {
			age = duration.HumanDuration(now.Sub(a.GetTime().AsTime()))
		}
		line("%s/%s\t%s\t%s\t%s\t%s\t%s", a.GetPodNamespace(), a.GetPodName(), a.GetContainer(), a.GetClassName(), devs, outcome, age)
	}
	return errors.Join(err, tw.Flush())
}

// shareText says a share in words: "memory 20Gi, compute 50%".
func shareText(share map[string]int64) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(share)) {
		v := share[name]
		switch name {
		case v1alpha1.CapacityMemory:
			parts = append(parts, "memory "+resource.NewQuantity(v, resource.BinarySI).String())
		case v1alpha1.CapacityCompute:
			parts = append(parts, "compute "+strconv.FormatInt(v, 10)+"%")
		default:
			parts = append(parts, name+" "+strconv.FormatInt(v, 10))
		}
	}
	return strings.Join(parts, ", ")
}

// printStatusDocument writes {"devices": [...], "allocations": [...]} in the
// protobuf JSON mapping (lowerCamelCase fields, RFC 3339 times), as JSON or YAML.
func printStatusDocument(w io.Writer, format string, devices []*agentv1.Device, allocations []*agentv1.Allocation) error {
	doc := struct {
		Devices     []json.RawMessage `json:"devices"`
		Allocations []json.RawMessage `json:"allocations"`
	}{Devices: []json.RawMessage{}, Allocations: []json.RawMessage{}}
	for _, d := range devices {
		data, err := marshalProto(d)
		if err != nil {
			return err
		}
		doc.Devices = append(doc.Devices, data)
	}
	for _, a := range allocations {
		data, err := marshalProto(a)
		if err != nil {
			return err
		}
		doc.Allocations = append(doc.Allocations, data)
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return err
		}
	} else {
		data = append(data, '\n')
	}
	_, err = w.Write(data)
	return err
}

// marshalProto writes m as compact JSON with every field, so that a NUMA node
// 0 or a healthy=false reads as such rather than as missing.
func marshalProto(m proto.Message) (json.RawMessage, error) {
	data, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; settle it.
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}
