package resourceclasses

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func decode(t *testing.T, raw, podNamespace string) (*Args, error) {
	t.Helper()
	return DecodeArgs(&runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}, podNamespace)
}

func TestDecodeArgsDefaults(t *testing.T) {
	want := &Args{
		Strategy:             FirstFit,
		ShareStrategy:        BinPack,
		AssignmentWrite:      WriteInBinding,
		StatusUpdateInterval: &metav1.Duration{Duration: time.Second},
		StatusLeaseNamespace: metav1.NamespaceSystem,
		StatusLeaseName:      "resclass-class-status",
	}
	// No args at all (the profile names the plugin without pluginConfig), an
	// empty object and JSON null all mean the defaults.
	for name, obj := range map[string]runtime.Object{
		"nil":          nil,
		"empty raw":    &runtime.Unknown{},
		"empty object": &runtime.Unknown{Raw: []byte(`{}`)},
		"null":         &runtime.Unknown{Raw: []byte(`null`)},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeArgs(obj, "")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v (interval %v), want %+v", got, got.StatusUpdateInterval, want)
			}
		})
	}

	// The lease lives in the scheduler's own namespace when it knows it.
	got, err := DecodeArgs(nil, "resclass-system")
	if err != nil || got.StatusLeaseNamespace != "resclass-system" {
		t.Errorf("with POD_NAMESPACE resclass-system: %+v, %v", got, err)
	}
}

func TestDecodeArgsValues(t *testing.T) {
	got, err := decode(t, `{"strategy":"NUMAAligned","shareStrategy":"Spread","assignmentWrite":"PreBind","statusUpdateInterval":"0s","statusLeaseNamespace":"sched","statusLeaseName":"my.lease"}`, "other")
	if err != nil {
		t.Fatal(err)
	}
	// 0 is kept, not defaulted: it turns status writing off.
	want := &Args{Strategy: NUMAAligned, ShareStrategy: Spread, AssignmentWrite: WriteInPreBind, StatusUpdateInterval: &metav1.Duration{}, StatusLeaseNamespace: "sched", StatusLeaseName: "my.lease"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestDecodeArgsRejects(t *testing.T) {
	for _, tc := range []struct {
		name, raw, podNamespace string
		want                    []string // substrings of the error
	}{
		{"unknown field", `{"strategy":"BinPack","statusInterval":"2s"}`, "", []string{"unknown field", "statusInterval"}},
		// Field names match exactly: a capitalised key is a misspelling, not an alias.
		{"field in the wrong case", `{"Strategy":"BinPack"}`, "", []string{"unknown field", "Strategy"}},
		{"duplicate field", `{"strategy":"BinPack","strategy":"Spread"}`, "", []string{"duplicate field", "strategy"}},
		{"unsupported strategy", `{"strategy":"Random"}`, "", []string{"args.strategy", `"Random"`, `"FirstFit"`, `"BinPack"`, `"Spread"`, `"NUMAAligned"`, `"Topology"`}},
		{"strategy in the wrong case", `{"strategy":"binpack"}`, "", []string{"args.strategy", "supported values"}},
		{"unsupported share strategy", `{"shareStrategy":"NUMAAligned"}`, "", []string{"args.shareStrategy", `"NUMAAligned"`, `"BinPack"`, `"Spread"`}},
		{"unsupported assignmentWrite", `{"assignmentWrite":"Patch"}`, "", []string{"args.assignmentWrite", `"Patch"`, `"Binding"`, `"PreBind"`}},
		{"negative interval", `{"statusUpdateInterval":"-1s"}`, "", []string{"args.statusUpdateInterval", "must not be negative"}},
		{"interval not a duration", `{"statusUpdateInterval":"soon"}`, "", []string{"soon"}},
		{"lease namespace not a label", `{"statusLeaseNamespace":"a.b"}`, "", []string{"args.statusLeaseNamespace"}},
		{"lease namespace upper case", `{"statusLeaseNamespace":"Sched"}`, "", []string{"args.statusLeaseNamespace"}},
		{"lease name not a subdomain", `{"statusLeaseName":"my_lease"}`, "", []string{"args.statusLeaseName"}},
		{"lease name too long", `{"statusLeaseName":"` + strings.Repeat("a", 254) + `"}`, "", []string{"args.statusLeaseName"}},
		{"invalid POD_NAMESPACE as default", `{}`, "Not_A_Namespace", []string{"args.statusLeaseNamespace"}},
		{"not an object", `["BinPack"]`, "", []string{"ResourceClasses args"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decode(t, tc.raw, tc.podNamespace)
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	// The framework hands typed args to plugins it knows; a typed object here is
	// a wiring mistake, not something to guess at.
	if _, err := DecodeArgs(&metav1.Status{}, ""); err == nil || !strings.Contains(err.Error(), "want an object") {
		t.Errorf("typed object: %v", err)
	}
}

func TestValidateArgsReportsEveryProblem(t *testing.T) {
	errs := ValidateArgs(&Args{Strategy: "x", ShareStrategy: "FirstFit", AssignmentWrite: "y", StatusUpdateInterval: &metav1.Duration{Duration: -time.Second}, StatusLeaseNamespace: "", StatusLeaseName: "UPPER"}, field.NewPath("args"))
	fields := map[string]bool{}
	for _, e := range errs {
		fields[e.Field] = true
	}
	for _, f := range []string{"args.strategy", "args.shareStrategy", "args.assignmentWrite", "args.statusUpdateInterval", "args.statusLeaseNamespace", "args.statusLeaseName"} {
		if !fields[f] {
			t.Errorf("no error for %s in %v", f, errs)
		}
	}
}

// FuzzDecodeArgs: whatever bytes the scheduler's config carries, DecodeArgs
// returns an error or args that are complete and valid, and that read back the
// same once written out.
func FuzzDecodeArgs(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `null`, `[]`, `"x"`, `{"strategy":"BinPack"}`,
		`{"strategy":"NUMAAligned","statusUpdateInterval":"2s","statusLeaseNamespace":"kube-system","statusLeaseName":"resclass-class-status"}`,
		`{"statusUpdateInterval":"-1s"}`, `{"statusUpdateInterval":"0s"}`, `{"statusUpdateInterval":12}`,
		`{"strategy":"Spread","strategy":"Spread"}`, `{"Strategy":"Spread"}`, `{"statusLeaseName":"a..b"}`,
		`{"strategy":null,"statusUpdateInterval":null}`, `{"assignmentWrite":"PreBind"}`, `{"assignmentWrite":"prebind"}`, `{"strategy":"\u0046irstFit"}`,
	} {
		f.Add([]byte(seed), "")
	}
	f.Add([]byte(`{}`), "resclass")
	f.Add([]byte(`{}`), "Bad Namespace")
	f.Fuzz(func(t *testing.T, data []byte, podNamespace string) {
		watchdog.Run(t, func() {
			args, err := DecodeArgs(&runtime.Unknown{Raw: data}, podNamespace)
			if err != nil {
				if args != nil {
					t.Fatalf("args %+v returned with error %v", args, err)
				}
				return
			}
			if args.Strategy == "" || args.ShareStrategy == "" || args.AssignmentWrite == "" || args.StatusUpdateInterval == nil || args.StatusLeaseNamespace == "" || args.StatusLeaseName == "" {
				t.Fatalf("args not defaulted: %+v", args)
			}
			if errs := ValidateArgs(args, field.NewPath("args")); len(errs) > 0 {
				t.Fatalf("DecodeArgs(%q) returned invalid args %+v: %v", data, args, errs)
			}
			raw, err := json.Marshal(args)
			if err != nil {
				t.Fatalf("marshal %+v: %v", args, err)
			}
			again, err := DecodeArgs(&runtime.Unknown{Raw: raw}, podNamespace)
			if err != nil {
				t.Fatalf("args %s, as written, are refused: %v", raw, err)
			}
			if !reflect.DeepEqual(again, args) {
				t.Fatalf("args %s read back as %+v, were %+v", raw, again, args)
			}
		})
	})
}
