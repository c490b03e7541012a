package deploy_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics/legacyregistry"
	schedulermetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/resclass/resclass/deploy/install"
	// Their init functions register the webhook's, the distribution
	// controller's and the scheduler plugin's metrics, as in the binaries.
	_ "github.com/resclass/resclass/pkg/distribution"
	"github.com/resclass/resclass/pkg/nodeagent"
	_ "github.com/resclass/resclass/pkg/scheduler/resourceclasses"
	_ "github.com/resclass/resclass/pkg/webhook"
)

// dashboardFile is the Grafana dashboard the chart ships
// (grafana.dashboard.enabled).
const dashboardFile = "deploy/helm/resclass/dashboards/resclass.json"

// targetLabels are the labels a series gets from its scrape, not from the
// binary: Prometheus's job and instance, and what the Prometheus Operator's
// PodMonitor adds to every target (namespace, pod, container, endpoint).
// Every query may use them.
var targetLabels = []string{"job", "instance", "namespace", "pod", "container", "endpoint"}

// nodeAgentTargetLabels are added to the node agent's series only, by its
// PodMonitor's relabeling (node: the pod's node; TestHelmChart/monitoring
// checks the relabeling is there).
var nodeAgentTargetLabels = []string{"node"}

// exportedMetrics maps each metric family the binaries export to its label
// names, read from the registries the binaries serve, as they build them:
//
//   - the node agent's own registry (nodeagent.New(...).Metrics(), which
//     newMetrics fills: its gauges and counters, the allocator's and the DRA
//     plugin's, the heartbeat);
//   - component-base's legacy registry, which the node agent and both
//     schedulers serve: the ResourceClasses plugin's metrics (registered by
//     its package's init) and kube-scheduler's (schedulermetrics.Register,
//     which the scheduler's Setup calls);
//   - controller-runtime's registry, which the webhook and the distribution
//     controller serve: their metrics (their packages' init) and
//     controller-runtime's own (webhook requests and latency).
//
// A vector has no sample until a label value is used, so gathering would
// miss most of them. Each registry is a *prometheus.Registry underneath,
// which is a prometheus.Collector: its Describe sends the Desc of every
// registered collector, samples or not, and Desc.String() is the only public
// form of a Desc's name and variable labels (parseDesc).
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	schedulermetrics.Register()
	registries := map[string]any{
		"node agent":                 nodeagent.New(nodeagent.Config{}, nil, nil).Metrics(),
		"legacyregistry":             legacyregistry.Registerer(),
		"controller-runtime metrics": ctrlmetrics.Registry,
	}
	out := map[string][]string{}
	for name, r := range registries {
		c, ok := r.(prometheus.Collector)
		if !ok {
			t.Fatalf("the %s registry is a %T, no prometheus.Collector: its descriptors cannot be read", name, r)
		}
		ch := make(chan *prometheus.Desc)
		go func() {
			c.Describe(ch)
			close(ch)
		}()
		n := 0
		for d := range ch {
			fq, labels, err := parseDesc(d.String())
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			out[fq] = labels
			n++
		}
		if n == 0 {
			t.Fatalf("the %s registry describes no metric", name)
		}
	}
	return out
}

// parseDesc reads the name and variable labels of a Desc's String():
// Desc{fqName: "name", help: "…", constLabels: {k="v",…}, variableLabels: {a,c(b),…}}.
func parseDesc(s string) (string, []string, error) {
	const head = `Desc{fqName: `
	if !strings.HasPrefix(s, head) {
		return "", nil, fmt.Errorf("unexpected Desc %q", s)
	}
	q, err := strconv.QuotedPrefix(s[len(head):])
	if err != nil {
		return "", nil, fmt.Errorf("Desc %q: %w", s, err)
	}
	name, _ := strconv.Unquote(q)
	// The help string is quoted, so the last variableLabels is the field.
	i := strings.LastIndex(s, ", variableLabels: {")
	if i < 0 || !strings.HasSuffix(s, "}}") {
		return "", nil, fmt.Errorf("unexpected Desc %q", s)
	}
	list := s[i+len(", variableLabels: {") : len(s)-2]
	var labels []string
	for _, l := range strings.Split(list, ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	// A constant label is a label too.
	if j := strings.Index(s, ", constLabels: {"); j >= 0 {
		consts := s[j+len(", constLabels: {") : i]
		for _, kv := range regexp.MustCompile(`(?:^|,)([a-zA-Z_][a-zA-Z0-9_]*)="`).FindAllStringSubmatch(strings.TrimSuffix(consts, "}"), -1) {
			labels = append(labels, kv[1])
		}
	}
	if name == "" {
		return "", nil, fmt.Errorf("Desc %q: no name", s)
	}
	return name, labels, nil
}

func TestParseDesc(t *testing.T) {
	d := prometheus.NewDesc("a_total", `help, variableLabels: {x}}`, []string{"b", "c"}, prometheus.Labels{"k": "v"})
	name, labels, err := parseDesc(d.String())
	if err != nil || name != "a_total" || !slices.Equal(labels, []string{"b", "c", "k"}) {
		t.Errorf("parseDesc(%s) = %q %v %v", d, name, labels, err)
	}
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

// dashboardQueries returns every panel target's expression and every query
// variable's label_values(metric, label) query.
func dashboardQueries(t *testing.T, data []byte) (exprs []query, variables []query) {
	t.Helper()
	var d struct {
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("panel %q, target %s: no expr", p.Title, tg.RefID)
				}
				exprs = append(exprs, query{fmt.Sprintf("panel %q, target %s", p.Title, tg.RefID), tg.Expr})
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
		}
		variables = append(variables, query{"variable " + v.Name, q.Query})
	}
	return exprs, variables
}

type dashboardPanel struct {
	Title   string           `json:"title"`
	Type    string           `json:"type"`
	Panels  []dashboardPanel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// TestDashboard checks that every query of the chart's Grafana dashboard
// names metrics the binaries export, with labels they carry: in matchers,
// in by/without, on/ignoring and group_left/group_right, and after each
// aggregation only the labels it kept (checkExpr).
func TestDashboard(t *testing.T) {
	root, err := install.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	exprs, variables := dashboardQueries(t, data)
	if len(exprs) < 20 || len(variables) == 0 {
		t.Fatalf("%d queries, %d variables: the dashboard was not read", len(exprs), len(variables))
	}
	used := map[string]bool{}
	for _, q := range exprs {
		names, err := checkExpr(q.expr, exported)
		if err != nil {
			t.Errorf("%s: %s: %v", q.where, q.expr, err)
		}
		for _, n := range names {
			used[n] = true
		}
	}
	for _, v := range variables {
		if err := checkLabelValues(v.expr, exported); err != nil {
			t.Errorf("%s: %v", v.where, err)
		}
	}
	// The panels the issue asks for stand on these.
	for _, m := range []string{"resclass_node_agent_device_holder", "resclass_scheduler_class_devices", "resclass_scheduler_class_pending_pods",
		"scheduler_unschedulable_pods", "resclass_webhook_denials_total", "up"} {
		if !used[m] {
			t.Errorf("no query of the dashboard uses %s", m)
		}
	}

	// Every query goes to the data source the dashboard's variable
	// datasource picks, a Prometheus one.
	checkDatasources(t, data)

	// The check fails when the dashboard and the binaries part: a metric
	// renamed on either side, a label removed.
	t.Run("a renamed metric fails", func(t *testing.T) {
		renamed := strings.ReplaceAll(string(data), "resclass_node_agent_device_holder{", "resclass_node_agent_device_holders{")
		if renamed == string(data) {
			t.Fatal("the dashboard does not query resclass_node_agent_device_holder{")
		}
		if failing(t, []byte(renamed), exported) == 0 {
			t.Error("a dashboard querying resclass_node_agent_device_holders passes")
		}
		gone := maps.Clone(exported)
		gone["resclass_scheduler_class_pending"] = gone["resclass_scheduler_class_pending_pods"]
		delete(gone, "resclass_scheduler_class_pending_pods")
		if failing(t, data, gone) == 0 {
			t.Error("the dashboard passes when the scheduler exports resclass_scheduler_class_pending instead of resclass_scheduler_class_pending_pods")
		}
	})
	t.Run("a removed label fails", func(t *testing.T) {
		gone := maps.Clone(exported)
		gone["resclass_node_agent_device_holder"] = slices.DeleteFunc(slices.Clone(gone["resclass_node_agent_device_holder"]), func(l string) bool { return l == "class" })
		if failing(t, data, gone) == 0 {
			t.Error("the dashboard passes when resclass_node_agent_device_holder has no label class")
		}
	})
}

// failing counts the dashboard's queries that fail against exported.
func failing(t *testing.T, data []byte, exported map[string][]string) int {
	exprs, variables := dashboardQueries(t, data)
	n := 0
	for _, q := range exprs {
		if _, err := checkExpr(q.expr, exported); err != nil {
			n++
		}
	}
	for _, v := range variables {
		if checkLabelValues(v.expr, exported) != nil {
			n++
		}
	}
	return n
}

func TestCheckExpr(t *testing.T) {
	exported := map[string][]string{
		"a_total":               {"class", "result"},
		"h_seconds":             {"webhook"},
		"g":                     {"class", "device"},
		"resclass_node_agent_g": {"device"},
	}
	for _, tc := range []struct {
		expr string
		err  string // a part of the error; "": none
	}{
		{`sum by (class) (rate(a_total{result="error"}[$__rate_interval]))`, ""},
		{`sum(rate(a_total[5m])) by (class)`, ""},
		{`histogram_quantile(0.99, sum by (webhook, le) (rate(h_seconds_bucket[5m])))`, ""},
		{`histogram_quantile(0.99, sum by (webhook) (rate(h_seconds_bucket[5m])))`, "does not carry le"},
		{`sum by (le) (rate(h_seconds_count[5m]))`, "does not carry le"},
		{`max by (class) (g{state="held"}) / max by (class) (g)`, "g has no label state"},
		{`max by (class) (g) / on (class) group_left (result) max by (class, result) (a_total)`, ""},
		{`max by (class) (g) / on (device) max by (class) (a_total)`, "on (device)"},
		{`count by (class) (count by (class, device) (g{class=~"$class"}))`, ""},
		{`sum by (device) (sum by (class) (g))`, "does not carry device"},
		{`sum without (device) (g)`, ""},
		{`sum without (node) (g)`, "does not carry node"},
		{`time() - max by (node) (resclass_node_agent_g{node=~"$node"})`, ""},
		{`max by (node) (g{node=~"$node"})`, "g has no label node"},
		{`sum(up{pod=~"x-.*"})`, ""},
		{`up{class="x"}`, "up has no label class"},
		{`g_renamed{class="x"}`, "g_renamed: no binary exports it"},
		{`a{class="x"}`, "a: no binary exports it"},
		{`sum by (class) (g_bucket)`, ""}, // no type in a Desc: any family has its _bucket form
		{`label_replace(g, "x", "$1", "class", "(.*)")`, "unsupported function label_replace"},
		{`{__name__="g"}`, "a selector without a metric name"},
		{`g{__name__="g"}`, "__name__"},
		{`sum by (class) (g) > bool 0`, ""},
		{`g or a_total`, ""},
		{`-g`, ""},
		{`max(g) by (class`, "expected"},
		{`g[5m:1m] offset 1h`, ""},
		{`topk(3, sum by (class) (g))`, ""},
		{`g{class="x"`, "expected"},
		{`g $node`, "unexpected"},
	} {
		_, err := checkExpr(tc.expr, exported)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.expr, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.expr, err, tc.err)
		}
	}
	for _, tc := range []struct{ query, err string }{
		{`label_values(g, class)`, ""},
		{`label_values(resclass_node_agent_g, node)`, ""},
		{`label_values(g, node)`, "does not carry node"},
		{`label_values(g{class="a"}, device)`, ""},
		{`label_values(class)`, "label_values(metric, label)"},
		{`label_values(h, class)`, "h: no binary exports it"},
	} {
		err := checkLabelValues(tc.query, exported)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.query, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.query, err, tc.err)
		}
	}
}

// checkLabelValues checks a Grafana query variable, which must be
// label_values(selector, label).
func checkLabelValues(q string, exported map[string][]string) error {
	q = strings.TrimSpace(q)
	if !strings.HasPrefix(q, "label_values(") || !strings.HasSuffix(q, ")") {
		return fmt.Errorf("%q: want label_values(metric, label)", q)
	}
	inner := q[len("label_values(") : len(q)-1]
	i := strings.LastIndex(inner, ",")
	if i < 0 {
		return fmt.Errorf("%q: want label_values(metric, label)", q)
	}
	label := strings.TrimSpace(inner[i+1:])
	_, err := checkExpr(fmt.Sprintf("max by (%s) (%s)", label, inner[:i]), exported)
	return err
}

// A small, strict reader of the PromQL the dashboard uses. It parses an
// expression (selectors with matchers, ranges, subqueries, offset, the
// functions of promqlFunctions, aggregations with by/without, binary
// operators with bool, on/ignoring and group_left/group_right) and follows
// the labels each part carries: a selector carries its metric's labels and
// the target labels; an aggregation the labels it keeps; a function its
// vector argument's (histogram_quantile less le); a binary operation its
// left side's (or with group_right its right side's; or both sides'). Every
// label a matcher, a by/without, an on/ignoring or a group_* names must be
// carried where it is used. Anything else (label_replace, count_values, a
// selector with no name) is an error, so that no query goes unchecked.

// checkExpr parses expr and returns the metric names it selects.
func checkExpr(expr string, exported map[string][]string) ([]string, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return nil, err
	}
	p := &promParser{toks: toks, exported: exported}
	if _, err := p.expr(0); err != nil {
		return nil, err
	}
	if p.peek().kind != tEOF {
		return nil, fmt.Errorf("unexpected %q at the end", p.peek().text)
	}
	return p.names, nil
}

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tNumber
	tString
	tVar // a Grafana variable: $x, ${x}
	tOp
)

type token struct {
	kind tokKind
	text string
}

func lexPromQL(s string) ([]token, error) {
	var out []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			out = append(out, token{tString, s[i+1 : j]})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(s) && s[j] == '{' {
				k := strings.IndexByte(s[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				j += k + 1
			} else {
				for j < len(s) && (s[j] == '_' || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j]))) {
					j++
				}
			}
			out = append(out, token{tVar, s[i:j]})
			i = j
		case c == '_' || unicode.IsLetter(rune(c)):
			j := i
			for j < len(s) && (s[j] == '_' || s[j] == ':' || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j]))) {
				j++
			}
			out = append(out, token{tIdent, s[i:j]})
			i = j
		case unicode.IsDigit(rune(c)) || c == '.':
			j := i
			for j < len(s) && (unicode.IsDigit(rune(s[j])) || s[j] == '.' || unicode.IsLetter(rune(s[j]))) {
				j++
			}
			out = append(out, token{tNumber, s[i:j]})
			i = j
		default:
			two := ""
			if i+1 < len(s) {
				two = s[i : i+2]
			}
			switch two {
			case "==", "!=", "=~", "!~", "<=", ">=":
				out = append(out, token{tOp, two})
				i += 2
				continue
			}
			if !strings.ContainsRune("+-*/%^<>=(){}[],:@", rune(c)) {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			out = append(out, token{tOp, string(c)})
			i++
		}
	}
	return append(out, token{kind: tEOF}), nil
}

// labelSet is what a part of an expression carries; nil: a scalar.
type labelSet map[string]bool

type promParser struct {
	toks     []token
	pos      int
	exported map[string][]string
	names    []string
}

func (p *promParser) peek() token { return p.toks[p.pos] }

func (p *promParser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *promParser) accept(kind tokKind, text string) bool {
	if t := p.peek(); t.kind == kind && t.text == text {
		p.pos++
		return true
	}
	return false
}

func (p *promParser) expect(kind tokKind, text string) error {
	if !p.accept(kind, text) {
		return fmt.Errorf("expected %q, found %q", text, p.peek().text)
	}
	return nil
}

// binaryPrecedence: or < and, unless < comparisons < + - < * / % atan2 < ^.
var binaryPrecedence = map[string]int{
	"or": 1, "and": 2, "unless": 2,
	"==": 3, "!=": 3, "<": 3, ">": 3, "<=": 3, ">=": 3,
	"+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6,
}

func (p *promParser) binaryOp() (string, int) {
	t := p.peek()
	if t.kind != tOp && t.kind != tIdent {
		return "", 0
	}
	prec, ok := binaryPrecedence[t.text]
	if !ok || (t.kind == tIdent) != (t.text == "or" || t.text == "and" || t.text == "unless" || t.text == "atan2") {
		return "", 0
	}
	return t.text, prec
}

// expr parses a binary expression of operators above minPrec.
func (p *promParser) expr(minPrec int) (labelSet, error) {
	left, err := p.unary()
	if err != nil {
		return nil, err
	}
	for {
		op, prec := p.binaryOp()
		// ^ is right-associative: a ^ at minPrec binds to the right.
		if prec == 0 || prec < minPrec || prec == minPrec && op != "^" {
			return left, nil
		}
		p.next()
		p.accept(tIdent, "bool")
		var on, ignoring, groupLeft, groupRight []string
		var hasOn, hasGroupLeft, hasGroupRight bool
		switch {
		case p.accept(tIdent, "on"):
			hasOn = true
			if on, err = p.labelList(); err != nil {
				return nil, err
			}
		case p.accept(tIdent, "ignoring"):
			if ignoring, err = p.labelList(); err != nil {
				return nil, err
			}
		}
		switch {
		case p.accept(tIdent, "group_left"):
			hasGroupLeft = true
			if p.peek().text == "(" {
				if groupLeft, err = p.labelList(); err != nil {
					return nil, err
				}
			}
		case p.accept(tIdent, "group_right"):
			hasGroupRight = true
			if p.peek().text == "(" {
				if groupRight, err = p.labelList(); err != nil {
					return nil, err
				}
			}
		}
		right, err := p.expr(prec)
		if err != nil {
			return nil, err
		}
		if left == nil || right == nil {
			if left == nil {
				left = right
			}
			continue
		}
		for _, l := range on {
			if !left[l] || !right[l] {
				return nil, fmt.Errorf("%s on (%s): a side does not carry %s", op, strings.Join(on, ", "), l)
			}
		}
		for _, l := range ignoring {
			if !left[l] && !right[l] {
				return nil, fmt.Errorf("%s ignoring (%s): no side carries %s", op, strings.Join(ignoring, ", "), l)
			}
		}
		for _, l := range groupLeft {
			if !right[l] {
				return nil, fmt.Errorf("group_left (%s): the right side does not carry %s", strings.Join(groupLeft, ", "), l)
			}
		}
		for _, l := range groupRight {
			if !left[l] {
				return nil, fmt.Errorf("group_right (%s): the left side does not carry %s", strings.Join(groupRight, ", "), l)
			}
		}
		switch {
		case op == "or":
			out := maps.Clone(left)
			maps.Copy(out, right)
			left = out
		case hasGroupRight:
			out := maps.Clone(right)
			for _, l := range groupRight {
				out[l] = true
			}
			left = out
		case hasGroupLeft:
			out := maps.Clone(left)
			for _, l := range groupLeft {
				out[l] = true
			}
			left = out
		case hasOn && op != "and" && op != "unless":
			// One-to-one on these labels: the result keeps the left side's.
		}
	}
}

func (p *promParser) unary() (labelSet, error) {
	if p.accept(tOp, "-") || p.accept(tOp, "+") {
		return p.unary()
	}
	return p.postfix()
}

// postfix parses a primary expression and its range, subquery, offset and @.
func (p *promParser) postfix() (labelSet, error) {
	ls, err := p.primary()
	if err != nil {
		return nil, err
	}
	for {
		switch {
		case p.accept(tOp, "["):
			if err := p.duration("]"); err != nil {
				return nil, err
			}
		case p.accept(tIdent, "offset"):
			p.accept(tOp, "-")
			if t := p.next(); t.kind != tNumber && t.kind != tVar {
				return nil, fmt.Errorf("offset: expected a duration, found %q", t.text)
			}
		case p.accept(tOp, "@"):
			if t := p.next(); t.kind != tNumber && t.text != "start" && t.text != "end" {
				return nil, fmt.Errorf("@: expected a time, found %q", t.text)
			}
			p.accept(tOp, "(")
			p.accept(tOp, ")")
		default:
			return ls, nil
		}
	}
}

// duration skips a range or subquery up to end: durations, Grafana
// variables and one colon.
func (p *promParser) duration(end string) error {
	for n := 0; ; n++ {
		t := p.next()
		switch {
		case t.kind == tOp && t.text == end && n > 0:
			return nil
		case t.kind == tNumber || t.kind == tVar || t.kind == tOp && t.text == ":":
		default:
			return fmt.Errorf("in a range: unexpected %q", t.text)
		}
	}
}

// The aggregations and functions the reader knows.
var (
	promqlAggregations = []string{"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "limitk", "limit_ratio"}
	// The functions whose result carries their vector argument's labels.
	promqlFunctions = []string{"rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "changes", "resets",
		"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time", "present_over_time",
		"quantile_over_time", "stddev_over_time", "stdvar_over_time", "abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max",
		"exp", "ln", "log2", "log10", "sqrt", "sort", "sort_desc", "timestamp", "histogram_quantile"}
	// The functions whose result carries no label.
	promqlScalarFunctions = []string{"time", "scalar", "vector", "absent", "absent_over_time", "pi"}
)

func (p *promParser) primary() (labelSet, error) {
	t := p.next()
	switch t.kind {
	case tNumber, tString:
		return nil, nil
	case tOp:
		switch t.text {
		case "(":
			ls, err := p.expr(0)
			if err != nil {
				return nil, err
			}
			return ls, p.expect(tOp, ")")
		case "{":
			return nil, fmt.Errorf("a selector without a metric name: name the metric")
		}
	case tIdent:
		switch {
		case slices.Contains(promqlAggregations, t.text):
			return p.aggregation(t.text)
		case p.peek().text == "(":
			return p.function(t.text)
		case slices.Contains(promqlScalarFunctions, t.text) || slices.Contains(promqlFunctions, t.text):
			return nil, fmt.Errorf("%s without (", t.text)
		}
		return p.selector(t.text)
	}
	return nil, fmt.Errorf("unexpected %q", t.text)
}

func (p *promParser) labelList() ([]string, error) {
	if err := p.expect(tOp, "("); err != nil {
		return nil, err
	}
	var out []string
	for !p.accept(tOp, ")") {
		t := p.next()
		if t.kind != tIdent {
			return nil, fmt.Errorf("expected a label name, found %q", t.text)
		}
		out = append(out, t.text)
		if !p.accept(tOp, ",") && p.peek().text != ")" {
			return nil, fmt.Errorf("expected \",\" or \")\", found %q", p.peek().text)
		}
	}
	return out, nil
}

func (p *promParser) aggregation(op string) (labelSet, error) {
	var by, without []string
	var hasBy, hasWithout bool
	grouping := func() error {
		var err error
		switch {
		case p.accept(tIdent, "by"):
			hasBy = true
			by, err = p.labelList()
		case p.accept(tIdent, "without"):
			hasWithout = true
			without, err = p.labelList()
		}
		return err
	}
	if err := grouping(); err != nil {
		return nil, err
	}
	if err := p.expect(tOp, "("); err != nil {
		return nil, err
	}
	var args []labelSet
	for {
		ls, err := p.expr(0)
		if err != nil {
			return nil, err
		}
		args = append(args, ls)
		if !p.accept(tOp, ",") {
			break
		}
	}
	if err := p.expect(tOp, ")"); err != nil {
		return nil, err
	}
	if !hasBy && !hasWithout {
		if err := grouping(); err != nil {
			return nil, err
		}
	}
	in := args[len(args)-1]
	if in == nil {
		return nil, fmt.Errorf("%s of a scalar", op)
	}
	for _, l := range append(slices.Clone(by), without...) {
		if !in[l] {
			return nil, fmt.Errorf("%s by/without (%s): its argument does not carry %s", op, strings.Join(append(by, without...), ", "), l)
		}
	}
	switch {
	case op == "topk" || op == "bottomk" || op == "limitk" || op == "limit_ratio":
		return in, nil
	case hasBy:
		out := labelSet{}
		for _, l := range by {
			out[l] = true
		}
		return out, nil
	case hasWithout:
		out := maps.Clone(in)
		for _, l := range without {
			delete(out, l)
		}
		return out, nil
	}
	return labelSet{}, nil
}

func (p *promParser) function(name string) (labelSet, error) {
	known := slices.Contains(promqlFunctions, name)
	if !known && !slices.Contains(promqlScalarFunctions, name) {
		return nil, fmt.Errorf("unsupported function %s: the dashboard test does not know which labels it makes", name)
	}
	if err := p.expect(tOp, "("); err != nil {
		return nil, err
	}
	var vec labelSet
	for !p.accept(tOp, ")") {
		ls, err := p.expr(0)
		if err != nil {
			return nil, err
		}
		if ls != nil && vec == nil {
			vec = ls
		}
		if !p.accept(tOp, ",") && p.peek().text != ")" {
			return nil, fmt.Errorf("%s: expected \",\" or \")\", found %q", name, p.peek().text)
		}
	}
	switch {
	case !known:
		if name == "vector" || name == "absent" || name == "absent_over_time" {
			return labelSet{}, nil
		}
		return nil, nil
	case vec == nil:
		return nil, fmt.Errorf("%s of no vector", name)
	case name == "histogram_quantile":
		if !vec["le"] {
			return nil, fmt.Errorf("histogram_quantile: its argument does not carry le (a _bucket series by le)")
		}
		out := maps.Clone(vec)
		delete(out, "le")
		return out, nil
	}
	return vec, nil
}

// labelsOf returns what a series of the named metric carries, or an error
// if no binary exports it.
func (p *promParser) labelsOf(name string) (labelSet, error) {
	out := labelSet{}
	for _, l := range targetLabels {
		out[l] = true
	}
	if name == "up" { // Prometheus's, per target.
		return out, nil
	}
	if strings.HasPrefix(name, "resclass_node_agent_") {
		for _, l := range nodeAgentTargetLabels {
			out[l] = true
		}
	}
	labels, ok := p.exported[name]
	if !ok {
		// A histogram's or summary's series. A Desc has no type, so any
		// family is taken to have them.
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, cut := strings.CutSuffix(name, suffix); cut {
				if labels, ok = p.exported[base]; ok && suffix == "_bucket" {
					out["le"] = true
				}
				break
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("%s: no binary exports it", name)
	}
	for _, l := range labels {
		out[l] = true
	}
	return out, nil
}

func (p *promParser) selector(name string) (labelSet, error) {
	ls, err := p.labelsOf(name)
	if err != nil {
		return nil, err
	}
	p.names = append(p.names, name)
	if !p.accept(tOp, "{") {
		return ls, nil
	}
	for !p.accept(tOp, "}") {
		l := p.next()
		if l.kind != tIdent {
			return nil, fmt.Errorf("%s{: expected a label name, found %q", name, l.text)
		}
		if l.text == "__name__" {
			return nil, fmt.Errorf("%s{__name__…}: name the metric instead", name)
		}
		if !ls[l.text] {
			return nil, fmt.Errorf("%s has no label %s", name, l.text)
		}
		if op := p.next(); op.kind != tOp || !slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) {
			return nil, fmt.Errorf("%s{%s: expected a matcher, found %q", name, l.text, op.text)
		}
		if v := p.next(); v.kind != tString {
			return nil, fmt.Errorf("%s{%s: expected a string, found %q", name, l.text, v.text)
		}
		if !p.accept(tOp, ",") && p.peek().text != "}" {
			return nil, fmt.Errorf("%s{: expected \",\" or \"}\", found %q", name, p.peek().text)
		}
	}
	return ls, nil
}

// checkDatasources checks that the dashboard has the variable datasource
// (type datasource, prometheus) and that every panel and target names it.
func checkDatasources(t *testing.T, data []byte) {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	vars, _ := d["templating"].(map[string]any)["list"].([]any)
	if !slices.ContainsFunc(vars, func(v any) bool {
		m := v.(map[string]any)
		return m["name"] == "datasource" && m["type"] == "datasource" && m["query"] == "prometheus"
	}) {
		t.Error("the dashboard has no variable datasource of type datasource, query prometheus")
	}
	want := map[string]any{"type": "prometheus", "uid": "${datasource}"}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ds, ok := v["datasource"]; ok && where != "annotations" && !reflect.DeepEqual(ds, want) {
				title, _ := v["title"].(string)
				t.Errorf("%s: datasource %v, want %v", cmp.Or(title, fmt.Sprintf("target %v", v["refId"])), ds, want)
			}
			for k, e := range v {
				walk(cmp.Or(where, k), e)
			}
		case []any:
			for _, e := range v {
				walk(where, e)
			}
		}
	}
	walk("", d)
}
