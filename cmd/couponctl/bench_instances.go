package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

// What deploy/ gives each IssueCoupon instance on Cloud Run (checked against the files by
// bench_instances_test.go).
const (
	deployPoolConns   = 4  // deploy/issue.env.yaml, DB_POOL_MAX_CONNS
	deployConcurrency = 16 // cloudbuild.yaml, deploy-issue's --concurrency
)

// instancesOptions are bench's flags for the instances cells.
type instancesOptions struct {
	instances []int
	loads     []string
	serveExe  string
}

// instancesHelp is bench's --help on --instances.
const instancesHelp = `

--instances N[,N...] runs, instead of the cells above, the instances cells: IssueCoupon as N
serving processes, as Cloud Run runs a service's instances. Each instance is a
` + "`couponctl serve`" + ` child process (FUNCTION_TARGET=IssueCoupon, its own pool of DB_POOL_MAX_CONNS
connections as deploy/issue.env.yaml sets it, 4, and its own coalescer, ISSUE_BATCH_MAX from
bench's environment), straight to the database (no latency proxy), its logs discarded. The
clients send each request to the next instance in turn (round robin over all requests, as Cloud
Run's load balancer spreads them). Cells: each N with each --clients count, plus Cloud Run's
shape, N x 16 clients (deploy-issue's --concurrency in cloudbuild.yaml), each with every --loads
load: hot-1 and hot-16 (one campaign of 1 or 16 stripes) and cold (500 campaigns of 1 stripe,
each request a new member of one at random). Each cell warms its fleet for 1 s, then runs
--duration. Its table gives the rate, p50 and p99, the server's core-ms per coupon and the
service's (utime+stime of every instance process, /proc/PID/stat), per coupon the database's
committed transactions (calls: one per coalesced group) and budget-stripe updates, the
rollbacks (pg_stat_database, pg_stat_user_tables), and the share of the database's active
sessions waiting on a lock (pg_stat_activity, sampled every 100 ms). --serve-exe runs another
couponctl as the instances (an earlier build, for before and after in alternating turns).`

// addInstancesFlags adds the instances cells' flags to f.
func addInstancesFlags(f *pflag.FlagSet, o *instancesOptions) {
	f.IntSliceVar(&o.instances, "instances", nil, "run the instances cells instead: IssueCoupon as this many serving processes, each count a fleet (such as 1,4,16)")
	names := make([]string, len(hotbench.Loads))
	for i, l := range hotbench.Loads {
		names[i] = l.Name
	}
	f.StringSliceVar(&o.loads, "loads", names, "with --instances: the loads of each cell")
	f.StringVar(&o.serveExe, "serve-exe", "", "with --instances: the couponctl binary the instances run (default: this one)")
}

// instancesCells are the cells of counts instances with clients each, then each count's Cloud
// Run shape (count x [deployConcurrency] clients) when not among them, ordered by count.
func instancesCells(counts, clients []int) []hotbench.Shape {
	var cells []hotbench.Shape
	for _, n := range counts {
		for _, c := range clients {
			cells = append(cells, hotbench.Shape{Instances: n, Clients: c})
		}
		if shape := (hotbench.Shape{Instances: n, Clients: n * deployConcurrency}); !slices.Contains(cells, shape) {
			cells = append(cells, shape)
		}
	}
	return cells
}

// instancesLoads are the loads names name, or a usage error.
func instancesLoads(names []string) ([]hotbench.Load, error) {
	var loads []hotbench.Load
	for _, name := range names {
		i := slices.IndexFunc(hotbench.Loads, func(l hotbench.Load) bool { return l.Name == name })
		if i < 0 {
			return nil, flagError("--loads %q: want some of hot-1, hot-16, cold", name)
		}
		loads = append(loads, hotbench.Loads[i])
	}
	if len(loads) == 0 {
		return nil, flagError("--loads: give at least one load")
	}
	return loads, nil
}

// checkInstances refuses instance counts under 1 and a duration under 1s, and returns o's
// loads ([instancesLoads]): usage errors.
func checkInstances(o instancesOptions, duration time.Duration) ([]hotbench.Load, error) {
	if slices.Min(o.instances) < 1 {
		return nil, flagError("--instances: give one or more instance counts, each at least 1")
	}
	if duration < time.Second {
		return nil, flagError("--duration %s: want at least 1s", duration)
	}
	return instancesLoads(o.loads)
}

// runInstancesBench runs the instances cells of o with clients and duration on DATABASE_URL or a
// throwaway server, and writes the table to stdout.
func runInstancesBench(cmd *cobra.Command, o instancesOptions, clients []int, duration time.Duration, format string) error {
	loads, err := checkInstances(o, duration)
	if err != nil {
		return err
	}
	exe := o.serveExe
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return err
		}
	} else if _, err := os.Stat(exe); err != nil {
		return flagError("--serve-exe: %v", err)
	}
	batchMax, err := envconf.IntIn("ISSUE_BATCH_MAX", issuance.DefaultBatchMax, 1, issuance.MaxBatchMax)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	errOut := cmd.ErrOrStderr()
	serverURL, serverCPU, stop, err := benchServer(ctx, cmd, exe, 0)
	if err != nil {
		return err
	}
	defer stop()
	fresh, err := isolationlab.OnServer(serverURL)
	if err != nil {
		return err
	}
	dbURL, drop, err := fresh(ctx)
	if err != nil {
		return err
	}
	defer drop()
	out := cmd.OutOrStdout()
	if err := writeMachine(ctx, out, dbURL, 0, batchMax); err != nil {
		return err
	}
	fmt.Fprintf(out, "instances: %s serve, pool of %d each, clients spread round robin\n", exe, deployPoolConns)
	cells := instancesCells(o.instances, clients)
	fmt.Fprintf(errOut, "instances cells: %s, %s of %s each\n", hotbench.Plural(len(o.instances), "fleet"),
		hotbench.Plural(len(cells)*len(loads), "cell"), duration)
	cfg := hotbench.InstancesConfig{DBURL: dbURL, Cells: cells, Loads: loads, Duration: duration, Progress: errOut, ServerCPU: serverCPU,
		Start: func(ctx context.Context, n int) (hotbench.Fleet, error) {
			return startFleet(ctx, exe, dbURL, n, errOut)
		}}
	rep, err := hotbench.RunInstances(ctx, cfg)
	if err != nil {
		return err
	}
	return hotbench.WriteInstances(out, format, serverCPU != nil, rep)
}

// fleet is n `couponctl serve` processes serving IssueCoupon, each on a port of its own.
type fleet struct {
	procs  []*exec.Cmd
	urls   []string
	client *http.Client
}

// startFleet starts n instances of exe serving IssueCoupon on dbURL, each with the deploy's
// pool size, and returns once each accepts connections (or the first fails).
func startFleet(ctx context.Context, exe, dbURL string, n int, progress io.Writer) (*fleet, error) {
	f := &fleet{client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: issuance.AppTimeout}}
	for range n {
		port, err := freePort()
		if err != nil {
			f.Close()
			return nil, err
		}
		c := exec.CommandContext(ctx, exe, "serve")
		c.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "FUNCTION_TARGET=IssueCoupon", "PORT="+port,
			fmt.Sprintf("DB_POOL_MAX_CONNS=%d", deployPoolConns))
		c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
		c.WaitDelay = 10 * time.Second
		if err := c.Start(); err != nil {
			f.Close()
			return nil, fmt.Errorf("starting %s serve: %w", exe, err)
		}
		f.procs = append(f.procs, c)
		f.urls = append(f.urls, "http://127.0.0.1:"+port+"/")
	}
	for i, u := range f.urls {
		if err := waitListening(ctx, strings.TrimSuffix(strings.TrimPrefix(u, "http://"), "/"), f.procs[i]); err != nil {
			f.Close()
			return nil, err
		}
	}
	fmt.Fprintf(progress, "%s serving IssueCoupon (pids %s)\n", hotbench.Plural(n, "instance"), f.pids())
	return f, nil
}

func (f *fleet) pids() string {
	s := make([]string, len(f.procs))
	for i, p := range f.procs {
		s[i] = fmt.Sprint(p.Process.Pid)
	}
	return strings.Join(s, ",")
}

// freePort is a loopback port free a moment ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

// waitListening waits until addr accepts connections, or fails when proc exits first or after
// 30 s.
func waitListening(ctx context.Context, addr string, proc *exec.Cmd) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		if proc.ProcessState != nil || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("instance %d never listened on %s", proc.Process.Pid, addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Issue sends one request to instance i.
func (f *fleet) Issue(ctx context.Context, i int, memberID, campaignID string) (string, error) {
	status, result, err := postForResult(ctx, f.client, f.urls[i], map[string]any{"member_id": memberID, "campaign_id": campaignID})
	if err == nil && status >= 500 && result != string(issuance.ResultRetryExhausted) {
		err = fmt.Errorf("HTTP %d %s", status, result)
	}
	return result, err
}

// CPU is the utime+stime of every instance process (procfs).
func (f *fleet) CPU() (time.Duration, error) {
	var sum float64
	for _, p := range f.procs {
		proc, err := procfs.NewProc(p.Process.Pid)
		if err != nil {
			return 0, err
		}
		st, err := proc.Stat()
		if err != nil {
			return 0, err
		}
		sum += st.CPUTime()
	}
	return time.Duration(sum * float64(time.Second)), nil
}

// Close stops every instance with SIGTERM, as Cloud Run does, and waits for them.
func (f *fleet) Close() error {
	var errs []error
	for _, p := range f.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range f.procs {
		if err := p.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("instance %d: %w", p.Process.Pid, err))
		}
	}
	f.procs = nil
	return errors.Join(errs...)
}
