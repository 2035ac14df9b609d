package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// runBench runs `cellbox-bench SUBCOMMAND` and writes its report to w.
func runBench(ctx context.Context, args []string, w io.Writer) error {
	if len(args) == 0 {
		return errors.New("want a subcommand: boxes, pipeline, runtime or cluster")
	}
	var rep *benchReport
	var asJSON bool
	var err error
	switch args[0] {
	case "boxes":
		rep, asJSON, err = benchBoxesCmd(ctx, args[1:])
	case "pipeline":
		rep, asJSON, err = benchPipelineCmd(ctx, args[1:])
	case "runtime":
		rep, asJSON, err = benchRuntimeCmd(ctx, args[1:])
	case "cluster":
		rep, asJSON, err = benchClusterCmd(ctx, args[1:])
	default:
		return fmt.Errorf("unknown subcommand %q: want boxes, pipeline, runtime or cluster", args[0])
	}
	if rep == nil || (err != nil && len(rep.Rows) == 0) {
		return err
	}
	// What was measured before an error (or an interrupt) is printed too.
	rep.finish()
	if err != nil {
		rep.note("the bench stopped early: %v", err)
	}
	var werr error
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		werr = enc.Encode(rep)
	} else {
		_, werr = io.WriteString(w, rep.markdown())
	}
	return errors.Join(err, werr)
}

// benchRow is one measurement: its percentiles, the baseline measured in the
// same run (if any) and the ratio of the two p50s.
type benchRow struct {
	Backend     string        `json:"backend"` // docker|local, or the cell store (memory|bbolt|etcd ×N)
	What        string        `json:"what"`
	N           int           `json:"n"`
	P50         time.Duration `json:"p50_ns"`
	P95         time.Duration `json:"p95_ns"`
	Mean        time.Duration `json:"mean_ns"`
	Baseline    string        `json:"baseline,omitempty"`
	BaselineP50 time.Duration `json:"baseline_p50_ns,omitempty"`
	// Ratio is P50 / BaselineP50 (0 without a baseline).
	Ratio float64 `json:"ratio,omitempty"`
	// Target is the p50 the row should stay under (0: none); Met says
	// whether it did.
	Target time.Duration `json:"target_p50_ns,omitempty"`
	Met    *bool         `json:"target_met,omitempty"`
}

// benchReport is the output of one bench run.
type benchReport struct {
	Bench    string     `json:"bench"` // boxes|pipeline|runtime|cluster
	Started  time.Time  `json:"started"`
	Duration string     `json:"duration"`
	Host     benchHost  `json:"host"`
	Rows     []benchRow `json:"rows"`
	// Notes say what was left out or how something was measured.
	Notes []string `json:"notes,omitempty"`
}

type benchHost struct {
	OS        string `json:"os"`
	CPUs      int    `json:"cpus"`
	Go        string `json:"go"`
	LoadStart string `json:"load_average_start"` // 1, 5, 15 minutes
	LoadEnd   string `json:"load_average_end"`
	Docker    string `json:"docker,omitempty"` // engine version, when the docker backend ran
}

func newBenchReport(bench string) *benchReport {
	return &benchReport{
		Bench:   bench,
		Started: time.Now().UTC(),
		Host: benchHost{
			OS:        goruntime.GOOS + "/" + goruntime.GOARCH,
			CPUs:      goruntime.NumCPU(),
			Go:        goruntime.Version(),
			LoadStart: loadAverage(),
		},
		Rows: []benchRow{},
	}
}

func (r *benchReport) finish() {
	r.Host.LoadEnd = loadAverage()
	r.Duration = time.Since(r.Started).Round(time.Second).String()
}

// noteDocker notes the Docker Engine's version, asked with the docker CLI
// that the baselines use.
func (r *benchReport) noteDocker(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").Output()
	if err != nil {
		return fmt.Errorf("docker CLI: docker version: %w", err)
	}
	r.Host.Docker = strings.TrimSpace(string(out))
	return nil
}

// add appends a row measured from samples, with the baseline's p50 (0: no
// baseline) and a target p50 (0: none).
func (r *benchReport) add(backend, what string, samples []time.Duration, baseline string, baseP50, target time.Duration) {
	row := benchRow{Backend: backend, What: what, N: len(samples), Target: target}
	row.P50, row.P95, row.Mean = percentiles(samples)
	if baseP50 > 0 && baseline != "" {
		row.Baseline, row.BaselineP50 = baseline, baseP50
		row.Ratio, _ = strconv.ParseFloat(strconv.FormatFloat(float64(row.P50)/float64(baseP50), 'g', 4, 64), 64)
	}
	if target > 0 {
		met := row.P50 < target
		row.Met = &met
	}
	r.Rows = append(r.Rows, row)
}

func (r *benchReport) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// markdown renders the report as a Markdown table for the README.
func (r *benchReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cellbox bench %s, %s: %s, %d CPUs, %s", r.Bench, r.Started.Format("2006-01-02 15:04 MST"), r.Host.OS, r.Host.CPUs, r.Host.Go)
	if r.Host.Docker != "" {
		fmt.Fprintf(&b, ", Docker Engine %s", r.Host.Docker)
	}
	fmt.Fprintf(&b, "; load average %s at the start, %s at the end; took %s.\n\n", r.Host.LoadStart, r.Host.LoadEnd, r.Duration)
	b.WriteString("| backend | what | n | p50 | p95 | mean | baseline | baseline p50 | ratio | target p50 |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|---|--:|--:|---|\n")
	for _, row := range r.Rows {
		base, baseP50, ratio, target := "—", "—", "—", ""
		if row.Baseline != "" {
			base, baseP50, ratio = row.Baseline, fmtDur(row.BaselineP50), strconv.FormatFloat(row.Ratio, 'g', 3, 64)+"×"
		}
		if row.Met != nil {
			mark := "✔"
			if !*row.Met {
				mark = "✘"
			}
			target = "< " + fmtDur(row.Target) + " " + mark
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n",
			row.Backend, row.What, row.N, fmtDur(row.P50), fmtDur(row.P95), fmtDur(row.Mean), base, baseP50, ratio, target)
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

// fmtDur prints a duration with three significant digits in a unit that
// suits it (ns, µs, ms, s).
func fmtDur(d time.Duration) string {
	f := float64(d)
	unit := []struct {
		name string
		size float64
	}{{"s", 1e9}, {"ms", 1e6}, {"µs", 1e3}}
	for _, u := range unit {
		// 999.7 ms prints as 1 s, not as 1e+03 ms.
		if f >= u.size*0.9995 {
			return strconv.FormatFloat(f/u.size, 'g', 3, 64) + " " + u.name
		}
	}
	return fmt.Sprintf("%d ns", d)
}

// percentiles returns the nearest-rank p50 and p95 and the mean.
func percentiles(samples []time.Duration) (p50, p95, mean time.Duration) {
	if len(samples) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := func(q float64) time.Duration {
		return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return rank(0.50), rank(0.95), sum / time.Duration(len(s))
}

// benchLoop runs fn up to n times, and stops early once budget has passed
// (after at least one run) or ctx ends. fn does one iteration and returns
// the time of the part it measures, so that setup and cleanup around it
// stay out of the numbers.
func benchLoop(ctx context.Context, n int, budget time.Duration, fn func(i int) (time.Duration, error)) ([]time.Duration, error) {
	samples := make([]time.Duration, 0, n)
	deadline := time.Now().Add(budget)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return samples, err
		}
		if i > 0 && time.Now().After(deadline) {
			break
		}
		d, err := fn(i)
		if err != nil {
			return samples, err
		}
		samples = append(samples, d)
	}
	return samples, nil
}

// timed measures fn.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// timedCmd measures a command line run to its end.
func timedCmd(ctx context.Context, argv ...string) (time.Duration, error) {
	return timed(func() error { return runCmd(ctx, argv...) })
}

// runCmd runs a command and folds its output into the error if it fails.
func runCmd(ctx context.Context, argv ...string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		if len(out) > 500 {
			out = append([]byte("…"), out[len(out)-500:]...)
		}
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// loadAverage is the 1, 5 and 15 minute load average ("?" if unknown).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// benchCommon are the flags every bench takes; each bench's options
// embed them.
type benchCommon struct {
	n           int
	budget      time.Duration
	backends    []string
	agentBinary string
	asJSON      bool

	backend   string
	allowNone bool
	allowKube bool // the bench measures boxes of the kubernetes backend too (boxes only)
}

// flags declares the common flags on fs, with the bench's defaults and
// help texts.
func (c *benchCommon) flags(fs *flag.FlagSet, n int, nHelp string, budget time.Duration, backendHelp, agentHelp string, allowNone bool) {
	c.allowNone = allowNone
	fs.StringVar(&c.backend, "backend", "both", backendHelp)
	fs.IntVar(&c.n, "n", n, nHelp)
	fs.DurationVar(&c.budget, "budget", budget, "time limit of each measurement loop")
	fs.StringVar(&c.agentBinary, "agent-binary", "", agentHelp)
	fs.BoolVar(&c.asJSON, "json", false, "print JSON instead of a Markdown table")
}

// parse parses args and checks the common flags, then more: checks of
// the bench's own flags (nil when fine).
func (c *benchCommon) parse(fs *flag.FlagSet, args []string, more ...func() error) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.backends, err = parseBackends(c.backend, c.allowNone, c.allowKube); err != nil {
		return err
	}
	errs := []error{positive("n", c.n)}
	for _, check := range more {
		errs = append(errs, check())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if c.budget <= 0 {
		return fmt.Errorf("--budget %s: want a positive duration", c.budget)
	}
	return nil
}

// parseBackends parses a --backend flag: docker, local, both, or (if
// allowed) none or kubernetes.
func parseBackends(v string, allowNone, allowKube bool) ([]string, error) {
	switch {
	case v == "docker" || v == "local" || (v == "kubernetes" && allowKube):
		return []string{v}, nil
	case v == "both":
		return []string{"docker", "local"}, nil
	case v == "none" && allowNone:
		return nil, nil
	case allowNone:
		return nil, fmt.Errorf("--backend %q: want docker, local, both or none", v)
	case allowKube:
		return nil, fmt.Errorf("--backend %q: want docker, local, kubernetes or both (docker and local)", v)
	}
	return nil, fmt.Errorf("--backend %q: want docker, local or both", v)
}

// positive checks a numeric flag.
func positive(name string, v int) error {
	if v <= 0 {
		return fmt.Errorf("--%s %d: want a positive number", name, v)
	}
	return nil
}
