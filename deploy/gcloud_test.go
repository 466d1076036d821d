package deploy_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The real Google Cloud CLI checks every command line the deploy runs. With an empty
// configuration (CLOUDSDK_CONFIG in a new directory) and no account, gcloud parses the whole
// command line, reads the files it names (a policy, a build config, an env-vars file), and
// then stops at its credential check; an unknown command, flag or value, or a file it cannot
// use, stops it before that with its own error. Nothing reaches Google.
const credentialCheck = "You do not currently have an active account selected"

// Environment of the gcloud stand-in ([gcloudShim]): the test binary itself, under the name
// gcloud, put first on a script's PATH.
const (
	shimReal  = "DEPLOY_TEST_REAL_GCLOUD" // the real gcloud's path
	shimLog   = "DEPLOY_TEST_GCLOUD_LOG"  // where each call is recorded, one JSON line per call
	shimState = "DEPLOY_TEST_GCLOUD_STATE"
	shimCache = "DEPLOY_TEST_GCLOUD_CACHE" // where accepted verdicts are kept ([checkWithGcloud])
)

// Project states a script is run against: nothing exists yet (its create path), or everything
// it makes exists from an earlier run (its update path).
const (
	stateEmpty    = "empty"
	stateDeployed = "deployed"
)

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "gcloud" && os.Getenv(shimReal) != "" {
		os.Exit(gcloudShim(os.Args[1:]))
	}
	dir, done, err := openVerdictCache()
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy tests:", err)
		os.Exit(1)
	}
	verdictCache = dir
	code := m.Run()
	done()
	os.Exit(code)
}

// verdictCache is where the real gcloud's acceptances are kept ([checkWithGcloud]).
var verdictCache string

// openVerdictCache returns the directory of remembered acceptances: the user's cache
// directory, so that a second run re-checks only what changed, or under CI=true a new one for
// this run only, so that CI asks the real gcloud about every command line. done removes a
// run-only directory.
func openVerdictCache() (string, func(), error) {
	if base, err := os.UserCacheDir(); err == nil && os.Getenv("CI") != "true" {
		dir := filepath.Join(base, "coupon-api", "gcloud-verdicts")
		if err := os.MkdirAll(dir, 0o700); err == nil {
			return dir, func() {}, nil
		}
	}
	dir, err := os.MkdirTemp("", "gcloud-verdicts-")
	return dir, func() { os.RemoveAll(dir) }, err
}

// gcloudCall is one gcloud command line a script ran, and what the real gcloud made of it.
type gcloudCall struct {
	Args   []string `json:"args"`
	Dir    string   `json:"dir"`
	Exit   int      `json:"exit"`
	Output string   `json:"output"` // gcloud's stderr and stdout
}

// accepted reports whether the real gcloud took the command line: it got as far as asking for
// credentials.
func (c gcloudCall) accepted() bool {
	return c.Exit == 1 && strings.Contains(c.Output, credentialCheck)
}

func (c gcloudCall) String() string { return "gcloud " + shellQuote(c.Args) }

// realGcloud returns the path of the Google Cloud CLI. Without one the test is skipped, saying
// which package installs it, except under CI=true, where it fails: CI must check the deploy.
func realGcloud(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("gcloud")
	if err != nil {
		msg := "gcloud not on PATH: the deploy's commands are checked by the real Google Cloud CLI " +
			"(Debian package google-cloud-cli, from Google's apt repository: https://cloud.google.com/sdk/docs/install#deb)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// checkWithGcloud runs gcloud ARGS in dir with an empty configuration, no account and no
// prompts, stdin as given, and records what it said. A command line the real gcloud took is
// remembered under cacheDir (when set), by everything its verdict depends on: the gcloud
// release, the arguments, stdin and the contents of every file an argument names (so a changed
// policy or build config is checked again); a refused one is always run again.
func checkWithGcloud(real, cacheDir, dir string, args []string, stdin io.Reader) (gcloudCall, error) {
	in, err := io.ReadAll(stdin)
	if err != nil {
		return gcloudCall{}, err
	}
	key := verdictKey(real, dir, args, in)
	if cacheDir != "" {
		// One run per command line at a time: the scripts' paths share most of their commands.
		// A lock older than staleLock was left by a run that was killed.
		lock := filepath.Join(cacheDir, key+".lock")
		for ; ; time.Sleep(50 * time.Millisecond) {
			if c, ok := cachedVerdict(cacheDir, key); ok {
				c.Dir = dir
				return c, nil
			}
			if err := os.Mkdir(lock, 0o700); err == nil {
				defer os.Remove(lock)
				break
			}
			if fi, err := os.Stat(lock); err == nil && time.Since(fi.ModTime()) > staleLock {
				os.Remove(lock)
			}
		}
	}
	config, err := os.MkdirTemp("", "gcloud-config-")
	if err != nil {
		return gcloudCall{}, err
	}
	defer os.RemoveAll(config)
	cmd := exec.Command(real, args...)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	cmd.Env = append(os.Environ(), "CLOUDSDK_CONFIG="+config, "CLOUDSDK_CORE_DISABLE_PROMPTS=1")
	out, err := cmd.CombinedOutput()
	call := gcloudCall{Args: args, Dir: dir, Output: string(out)}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		call.Exit = exit.ExitCode()
	case err != nil:
		return call, err
	}
	if cacheDir != "" && call.accepted() {
		b, _ := json.Marshal(call)
		tmp := filepath.Join(cacheDir, key+".tmp"+strconv.Itoa(os.Getpid()))
		if os.WriteFile(tmp, b, 0o600) == nil {
			_ = os.Rename(tmp, filepath.Join(cacheDir, key))
		}
	}
	return call, nil
}

// staleLock is how long a command line's lock may be held: far longer than gcloud takes to
// parse one on a busy machine.
const staleLock = 2 * time.Minute

func cachedVerdict(cacheDir, key string) (gcloudCall, bool) {
	var c gcloudCall
	b, err := os.ReadFile(filepath.Join(cacheDir, key))
	return c, err == nil && json.Unmarshal(b, &c) == nil
}

// verdictKey names what the real gcloud's verdict on ARGS in dir depends on.
func verdictKey(real, dir string, args []string, stdin []byte) string {
	h := sha256.New()
	sdk, _ := filepath.EvalSymlinks(real)
	version, _ := os.ReadFile(filepath.Join(filepath.Dir(sdk), "..", "VERSION"))
	fmt.Fprintf(h, "%s\x00%s\x00%q\x00%q\x00", sdk, version, args, stdin)
	for _, a := range args {
		_, v, _ := strings.Cut(a, "=")
		for _, name := range []string{a, v} {
			if name == "" {
				continue
			}
			p := name
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, p)
			}
			fi, err := os.Stat(p)
			switch {
			case err != nil:
			case fi.IsDir():
				entries, _ := os.ReadDir(p)
				for _, e := range entries {
					fmt.Fprintf(h, "dir %s: %s\x00", name, e.Name())
				}
			default:
				b, _ := os.ReadFile(p)
				fmt.Fprintf(h, "file %s: %q\x00", name, b)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// gcloudShim is the gcloud that the scripts run in these tests. It passes each command line to
// the real gcloud (recording its verdict in $DEPLOY_TEST_GCLOUD_LOG), then answers as a project
// in state $DEPLOY_TEST_GCLOUD_STATE would, so that the script goes on along that path. It
// answers even a command the real gcloud refused, so that one run shows every refusal.
func gcloudShim(args []string) int {
	dir, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcloud shim:", err)
		return 3
	}
	call, err := checkWithGcloud(os.Getenv(shimReal), os.Getenv(shimCache), dir, args, os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcloud shim:", err)
		return 3
	}
	line, _ := json.Marshal(call)
	f, err := os.OpenFile(os.Getenv(shimLog), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = f.Write(append(line, '\n'))
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcloud shim:", err)
		return 3
	}
	out, code := projectAnswer(os.Getenv(shimState), args)
	fmt.Print(out)
	if code != 0 {
		fmt.Fprintln(os.Stderr, "ERROR: (gcloud shim) NOT_FOUND: no such resource in this project state")
	}
	return code
}

// projectAnswer is what gcloud ARGS prints, and its exit code, in a project that is empty or
// holds what the scripts deploy. Only lookups differ; every other command succeeds silently.
func projectAnswer(state string, args []string) (string, int) {
	cmd := strings.Join(commandWords(args), " ")
	format := flagValue(args, "--format")
	deployed := state == stateDeployed
	switch {
	case strings.HasSuffix(cmd, " describe"):
		if !deployed && cmd != "run services describe" {
			return "", 1
		}
		switch {
		case cmd == "run services describe":
			return "https://relay-outbox-4a2b-an.a.run.app\n", 0
		case cmd == "monitoring dashboards describe":
			return "etag-7\n", 0
		case cmd == "alpha monitoring policies describe" && format != "":
			// A policy an operator has disabled and given a channel of their own.
			return "False\tprojects/" + testProject + "/notificationChannels/77\n", 0
		}
		return "", 0
	case cmd == "monitoring dashboards list" && deployed:
		return "projects/" + testProject + "/dashboards/d1\n", 0
	case cmd == "alpha monitoring policies list" && deployed:
		name := strings.TrimPrefix(flagValue(args, "--filter"), "displayName=")
		return "projects/" + testProject + "/alertPolicies/" + strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(name), "-"), "-") + "\n", 0
	case cmd == "alpha monitoring policies create":
		return "projects/" + testProject + "/alertPolicies/new\n", 0
	case cmd == "beta services identity create":
		return "service-" + testProjectNumber + "@gcp-sa-iap.iam.gserviceaccount.com\n", 0
	case cmd == "run revisions list":
		return flagValue(args, "--service") + "-00002\n" + flagValue(args, "--service") + "-00001\n", 0
	}
	return "", 0
}

// commandWords are the words of a gcloud command line before its first flag or resource
// argument (gcloud's command groups and command are lower-case words).
func commandWords(args []string) []string {
	var words []string
	for _, a := range args {
		if !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(a) || len(words) >= 4 {
			break
		}
		words = append(words, a)
	}
	// "gcloud run services describe issue-coupon": a resource id can look like a command word;
	// every command here is at most four words and ends in a verb.
	for i, w := range words {
		if slices.Contains([]string{"describe", "list", "create", "update", "deploy", "submit", "enable", "add-iam-policy-binding", "get-iam-policy", "execute", "add", "http"}, w) {
			return words[:i+1]
		}
	}
	return words
}

// flagValue is the value of --NAME=VALUE in args, "" if absent.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// runWithGcloud runs `bash SCRIPT ARGS` in dir with the gcloud stand-in first on PATH, against
// a project in state, and returns what it printed and every gcloud call it made.
func runWithGcloud(t *testing.T, real, state, dir string, argv ...string) (string, []gcloudCall, error) {
	t.Helper()
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(bin, "gcloud")); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(bin, "calls.jsonl")
	cmd := exec.Command("bash", argv...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		shimReal+"="+real, shimLog+"="+log, shimState+"="+state, shimCache+"="+verdictCache,
		"PREVIOUS_RELEASE_FILE="+filepath.Join(bin, "previous-release")) // build.sh's record of the release, kept out of the tree
	out, runErr := cmd.CombinedOutput()
	return string(out), readCalls(t, log), runErr
}

func readCalls(t *testing.T, path string) []gcloudCall {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var calls []gcloudCall
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var c gcloudCall
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		calls = append(calls, c)
	}
	return calls
}

// refusals fails the test for every call the real gcloud did not take, naming the command and
// quoting gcloud's error.
func refusals(t *testing.T, what string, calls []gcloudCall) {
	t.Helper()
	for _, c := range calls {
		if !c.accepted() {
			t.Errorf("%s: the real gcloud refused (exit %d):\n  %s\n%s", what, c.Exit, c, indent(gcloudError(c.Output)))
		}
	}
}

// gcloudError is the ERROR line(s) of gcloud's output, without its advice on logging in.
func gcloudError(out string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "To search the help text") || strings.HasPrefix(l, "Please run:") || strings.HasPrefix(l, "Usage:") {
			break
		}
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

// shellQuote renders args as a shell would need them typed.
func shellQuote(args []string) string {
	q := make([]string, len(args))
	plain := regexp.MustCompile(`^[A-Za-z0-9_./:=,@%+-]+$`)
	for i, a := range args {
		if plain.MatchString(a) {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// scriptRun is one run of a deploy script against the real gcloud: the project state it meets,
// and commands that show it took the path of that state (want) and not another (not).
type scriptRun struct {
	script string
	args   []string
	state  string
	want   []string
	not    []string
}

const testChannel = "projects/" + testProject + "/notificationChannels/42"

// scriptRuns are both paths of every deploy script that runs gcloud.
var scriptRuns = []scriptRun{
	{script: "setup.sh", state: stateEmpty,
		want: []string{"sql instances create", "sql databases create", "sql users create", "secrets create", "iam service-accounts create", "artifacts repositories create", "add-iam-policy-binding",
			// RedeemCoupon's own account and database login.
			"iam service-accounts create coupon-redeem ", "sql users create coupon-redeem@" + testProject + ".iam "}},
	{script: "setup.sh", state: stateDeployed, want: []string{"add-iam-policy-binding"}, not: []string{" create "}},
	// The dry runs' read pool (gcloud 528: beta), on a primary in Enterprise Plus; none without the flag.
	{script: "setup.sh", args: []string{"--read-pool-nodes", "2"}, state: stateEmpty,
		want: []string{"sql instances create coupon-db --project=" + testProject + " --region=asia-northeast1 --database-version=POSTGRES_15 --edition=ENTERPRISE_PLUS --tier=db-perf-optimized-N-2 ",
			"beta sql instances create coupon-db-read --project=" + testProject + " --region=asia-northeast1 --master-instance-name=coupon-db --instance-type=READ_POOL_INSTANCE --node-count=2 --edition=ENTERPRISE_PLUS "}},
	{script: "setup.sh", args: []string{"--read-pool-nodes", "2"}, state: stateDeployed, want: []string{"sql instances describe coupon-db-read "}, not: []string{" create "}},
	{script: "setup.sh", state: stateEmpty, want: []string{"--edition=ENTERPRISE --tier=db-custom-2-7680 "}, not: []string{"coupon-db-read", "READ_POOL_INSTANCE"}},
	{script: "build.sh", state: stateEmpty, want: []string{"builds submit"}},
	{script: "build.sh", args: []string{"--read-pool-nodes", "2"}, state: stateEmpty, want: []string{"_INSTANCE=coupon-db,_READ_POOL_NODES=2"}},
	{script: "access.sh", args: []string{"--console-group", testConsoleGroup}, state: stateEmpty,
		want: []string{"scheduler jobs create http", "beta iap web add-iam-policy-binding --resource-type=cloud-run --service=coupon-console",
			"run services add-iam-policy-binding coupon-console --project=" + testProject + " --member=serviceAccount:service-" + testProjectNumber + "@gcp-sa-iap",
			"run services add-iam-policy-binding coupon-redeem --project=" + testProject + " --member=serviceAccount:coupon-gateway@" + testProject + ".iam.gserviceaccount.com --role=roles/run.invoker "},
		not: []string{"scheduler jobs update"}},
	{script: "access.sh", args: []string{"--console-group", testConsoleGroup}, state: stateDeployed,
		want: []string{"scheduler jobs update http", "beta iap web get-iam-policy", "run services get-iam-policy coupon-redeem "}, not: []string{"scheduler jobs create"}},
	{script: "daily.sh", state: stateEmpty, want: []string{"run jobs deploy", "scheduler jobs create http"}, not: []string{"scheduler jobs update"}},
	{script: "daily.sh", state: stateDeployed, want: []string{"run jobs deploy", "scheduler jobs update http"}, not: []string{"scheduler jobs create"}},
	{script: "monitoring.sh", args: []string{"--notification-channel", testChannel}, state: stateEmpty,
		want: []string{"monitoring dashboards create", "monitoring policies create"}, not: []string{"policies update projects/" + testProject + "/alertPolicies/coupon"}},
	{script: "monitoring.sh", args: []string{"--notification-channel", testChannel}, state: stateDeployed,
		want: []string{"monitoring dashboards update", "monitoring policies update"}, not: []string{" create "}},
	// Without a channel, a policy in place keeps the operator's (projectAnswer's 77).
	{script: "monitoring.sh", state: stateDeployed,
		want: []string{"--no-enabled --set-notification-channels=projects/" + testProject + "/notificationChannels/77 "}, not: []string{" create "}},
	{script: "rollback.sh", state: stateDeployed, want: []string{"run revisions list", "run services update-traffic coupon-console",
		"run services update-traffic coupon-redeem --project=" + testProject + " --region=asia-northeast1 --to-revisions=coupon-redeem-00001=100"}},
	{script: "rollback.sh", args: []string{"--issue-revision", "issue-coupon-00007", "--relay-revision", "relay-outbox-00003", "--redeem-revision", "coupon-redeem-00004", "--console-revision", "coupon-console-00002"}, state: stateDeployed,
		want: []string{"run services update-traffic", "--to-revisions=coupon-redeem-00004=100"}, not: []string{"revisions list"}},
}

// TestScriptsWithRealGcloud runs every deploy script that calls gcloud, for real (no
// --dry-run), on its create path and its update path, and passes every gcloud command line it
// runs to the real gcloud, which must take it.
func TestScriptsWithRealGcloud(t *testing.T) {
	t.Parallel()
	real := realGcloud(t)
	for _, r := range scriptRuns {
		name := strings.Join(append([]string{r.script, r.state}, r.args...), " ")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			argv := append([]string{r.script, "--project", testProject}, r.args...)
			out, calls, err := runWithGcloud(t, real, r.state, ".", argv...)
			if err != nil {
				t.Errorf("bash %s: %v\n%s", strings.Join(argv, " "), err, out)
			}
			if len(calls) == 0 {
				t.Fatalf("%s ran no gcloud command:\n%s", r.script, out)
			}
			refusals(t, name, calls)
			var ran []string
			for _, c := range calls {
				ran = append(ran, c.String())
			}
			all := strings.Join(ran, "\n")
			for _, w := range r.want {
				if !strings.Contains(all, w) {
					t.Errorf("%s: no %q among the commands it ran:\n%s", name, w, all)
				}
			}
			for _, n := range r.not {
				if strings.Contains(all, n) {
					t.Errorf("%s: ran %q, which is another path's:\n%s", name, n, all)
				}
			}
		})
	}
}

// uploadedTree copies into a new directory the files `gcloud builds submit` uploads from the
// repository (gcloud meta list-files-for-upload: .gcloudignore, or without one .gitignore,
// and never .git), and returns it: the tree Cloud Build's steps run in.
func uploadedTree(t *testing.T, real string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	config := t.TempDir()
	cmd := exec.Command(real, "meta", "list-files-for-upload", root)
	cmd.Env = append(os.Environ(), "CLOUDSDK_CONFIG="+config, "CLOUDSDK_CORE_DISABLE_PROMPTS=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gcloud meta list-files-for-upload: %v\n%s", err, stderr.Bytes())
	}
	ws := t.TempDir()
	files := strings.Fields(string(out))
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(ws, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, f), b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	if len(files) < 10 || slices.ContainsFunc(files, func(f string) bool { return strings.HasPrefix(f, ".git/") }) {
		t.Fatalf("gcloud would upload %d files, .git among them or nearly none: %q", len(files), files)
	}
	return ws
}

// TestCloudBuildStepsWithRealGcloud runs cloudbuild.yaml's gcloud and Cloud SDK steps in
// order, as Cloud Build does, in the tree `gcloud builds submit` uploads: each argument with
// the substitutions filled in, nothing split or joined. A gcloud step goes to the real gcloud,
// which must take it; a script step runs for real, with the gcloud stand-in on PATH, and must
// succeed. (The test step is TestCIStepInUploadedTree's; migrate needs the database.)
func TestCloudBuildStepsWithRealGcloud(t *testing.T) {
	t.Parallel()
	real := realGcloud(t)
	cb := loadCloudBuild(t)
	ws := uploadedTree(t, real)
	var checked []string
	for _, s := range cb.GetSteps() {
		args := make([]string, len(s.GetArgs()))
		for i, a := range s.GetArgs() {
			args[i] = substitute(cb, a)
		}
		switch {
		case s.GetEntrypoint() == "gcloud":
			call, err := checkWithGcloud(real, verdictCache, ws, args, strings.NewReader(""))
			if err != nil {
				t.Fatal(err)
			}
			refusals(t, "step "+s.GetId(), []gcloudCall{call})
		case strings.Contains(s.GetName(), "cloud-sdk"):
			out, calls, err := runWithGcloud(t, real, stateEmpty, ws, args...)
			if s.GetEntrypoint() != "bash" {
				t.Fatalf("step %s: entrypoint %q: want gcloud or bash", s.GetId(), s.GetEntrypoint())
			}
			if err != nil {
				t.Errorf("step %s: bash %s: %v\n%s", s.GetId(), shellQuote(args), err, out)
			}
			refusals(t, "step "+s.GetId(), calls)
		default:
			continue
		}
		checked = append(checked, s.GetId())
	}
	for _, id := range []string{"env-files", "deploy-issue", "deploy-relay", "deploy-redeem", "deploy-console"} {
		if !slices.Contains(checked, id) {
			t.Errorf("step %s of cloudbuild.yaml not checked (checked %q): want the env files and the four deploys", id, checked)
		}
	}
}

// TestRealGcloudRefusesWhatItRefusedBefore passes command lines the real gcloud refused to
// it again, each still refused with the error recorded, so a check that took everything would
// fail here: testdata/refused-at-2cf95fc.json, what the deploy ran at 2cf95fc; and
// testdata/refused-iap-ga.json, the GA forms of the console's IAP commands, which SDK 528 has
// in beta only (gcloud run deploy --iap, run services update --iap, iap web
// --resource-type=cloud-run), and iap web enable, which takes no Cloud Run service in any track.
// A refusal is never remembered, so each runs the real gcloud: all at once.
func TestRealGcloudRefusesWhatItRefusedBefore(t *testing.T) {
	t.Parallel()
	real := realGcloud(t)
	files, err := filepath.Glob("testdata/refused-*.json")
	if err != nil || len(files) < 2 {
		t.Fatalf("testdata/refused-*.json: %v, %q", err, files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var before []struct {
			Script string   `json:"script"`
			Args   []string `json:"args"`
			Error  string   `json:"error"`
		}
		if err := json.Unmarshal(b, &before); err != nil || len(before) == 0 {
			t.Fatalf("%s: %v", f, err)
		}
		for _, c := range before {
			t.Run(strings.TrimSuffix(filepath.Base(f), ".json")+" "+c.Script, func(t *testing.T) {
				t.Parallel()
				call, err := checkWithGcloud(real, verdictCache, ".", c.Args, strings.NewReader(""))
				if err != nil {
					t.Fatal(err)
				}
				if call.accepted() || call.Exit != 2 || !strings.Contains(call.Output, c.Error) {
					t.Errorf("%s, %s: gcloud %s: exit %d, want 2 and %q\n%s", f, c.Script, shellQuote(c.Args), call.Exit, c.Error, call.Output)
				}
			})
		}
	}
}
