package console

import (
	"context"
	_ "embed"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// axeScript is axe-core (testdata/axe-core: its version, source and licence).
//
//go:embed testdata/axe-core/axe.min.js
var axeScript string

// axeViolation is one rule axe-core finds broken on a page, with the nodes that break it.
type axeViolation struct {
	ID, Impact, Help string
	Nodes            []string
}

// axeRun injects axe-core into ctx's page and runs it: the violations of impact serious or
// critical (WCAG 2.x A and AA rules and axe's best practices).
func axeRun(t *testing.T, ctx context.Context) []axeViolation {
	t.Helper()
	get(t, ctx, chromedp.Evaluate[bool](axeScript+";true"))
	return get(t, ctx, chromedp.Evaluate[[]axeViolation](`axe.run(document, {resultTypes: ["violations"]}).then(r =>
  r.violations.filter(v => v.impact === "serious" || v.impact === "critical").map(v =>
    ({ID: v.id, Impact: v.impact, Help: v.help, Nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))})))`, chromedp.EvalAwaitPromise))
}

// accessible is the accessibility check: every page of the console (each person's first page
// alone unless everyPage), at 1280 px and at 390 px, as the people who see it (a viewer, an
// operator with its forms and the end's confirmation, an approver's inbox), with axe-core
// injected, has no serious or critical violation.
func accessible(t *testing.T, v *verdict, everyPage bool) {
	e := setup(t, verifiedIAP)
	teamCampaigns(t, e)
	r, id := e.issueCoupon(t, "m-axe", "OPEN")
	if r != "ISSUED" {
		t.Fatalf("IssueCoupon: %s", r)
	}
	a := e.poster(t, approverEmail, "/campaigns/OPEN")
	if status, _, body := a.post(t, "/campaigns/OPEN/budget", url.Values{"reason": {"増額"}, "add_budget_yen": {"500000"}}); status != http.StatusSeeOther {
		t.Fatalf("a request: %d %.300s", status, body)
	}
	b := newBrowser(t)
	for _, who := range []struct {
		email string
		paths []string
	}{
		{viewerEmail, []string{"/", "/campaigns/DAILY", "/campaigns/SOON", "/members/g1", "/audit"}},
		{operatorEmail, []string{"/campaigns/OPEN", "/coupons/" + id}},
		{approver2Email, []string{"/requests"}},
	} {
		if !everyPage { // the list alone, as a viewer
			who.paths = who.paths[:1]
		}
		ctx := b.as(t, e.idp.assertion(t, who.email))
		for _, width := range []int64{1280, 390} {
			do(t, ctx, chromedp.EmulateViewport(width, 900))
			for _, p := range who.paths {
				e.open(t, ctx, p)
				for _, x := range axeRun(t, ctx) {
					v.Errorf("%s at %d px as %s: %s (%s): %s at %s", p, width, who.email, x.ID, x.Impact, x.Help, strings.Join(x.Nodes, ", "))
				}
			}
		}
		if everyPage && who.email == operatorEmail { // the confirmation page
			e.open(t, ctx, "/campaigns/OPEN")
			submit(t, ctx, "end", "", map[string]string{"reason": "終了"})
			for _, x := range axeRun(t, ctx) {
				v.Errorf("the end's confirmation: %s (%s): %s at %s", x.ID, x.Impact, x.Help, strings.Join(x.Nodes, ", "))
			}
		}
	}
}

// TestPagesPassAxe: every page passes axe-core (accessible). Also run on a console whose header
// is LINE's green again (white on #06c755, 2.26:1, set on the element before axe runs): found.
func TestPagesPassAxe(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { accessible(t, v, true) }, brokenVariant{"the header in LINE's green", func(t *testing.T, v *verdict) {
		saved := axeScript
		axeScript = `document.querySelector("header").style.setProperty("background", "#06c755", "important");` + saved
		t.Cleanup(func() { axeScript = saved })
		accessible(t, v, false) // each person's first page: enough to find it
	}})
}
