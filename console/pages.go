package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/csrf"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/shared/issuance"
)

var tokyo = issuance.Tokyo

// The console roles (console_roles, kept in the database; `couponctl console grant`).
const (
	roleOperator = "operator"
	roleApprover = "approver"
)

type server struct {
	reads   *reads
	actions *actions
	tmpl    *template.Template
	log     *slog.Logger
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.listPage)
	mux.HandleFunc("GET /campaigns/{id}", s.campaignPage)
	mux.HandleFunc("GET /campaigns/{id}/burndown.json", s.burndownJSON)
	mux.HandleFunc("GET /coupons/{id}", s.couponPage)
	mux.HandleFunc("GET /members/{id}", s.memberPage)
	mux.HandleFunc("GET /find", s.find)
	mux.HandleFunc("GET /requests", s.inbox)
	mux.HandleFunc("GET /exports/campaigns.csv", s.exportCampaigns)
	mux.HandleFunc("GET /audit", s.auditPage)
	mux.HandleFunc("GET /exports/audit.csv", s.exportAudit)
	mux.HandleFunc("GET /campaigns/{id}/series.csv", s.exportSeries)
	mux.Handle("GET /static/", s.static())
	mux.HandleFunc("/", s.notFound)
	mux.HandleFunc("POST /campaigns/{id}/{action}", s.campaignAction)
	mux.HandleFunc("POST /requests/{rid}/{action}", s.decide)
	mux.HandleFunc("POST /coupons/{id}/void", s.void)
	return mux
}

// page is what every template gets.
type page struct {
	Title     string
	Person    string
	Role      string
	CSRF      template.HTML
	Done      string
	Error     string
	Now       time.Time
	CanChange bool // operator or approver: pause, resume, end, budget, void
	CanDecide bool // approver: approve, reject
	// Pending is how many requests wait for an approver (承認待ち n 件 in an approver's header).
	Pending int
	Data    any
}

// newPage fills what every page shows: who is looking, with which role (from the database),
// the CSRF field for its forms, and the message of the change that redirected here.
func (s *server) newPage(r *http.Request, title string) (page, error) {
	p := page{Title: title, Person: person(r), CSRF: csrf.TemplateField(r), Now: time.Now()}
	role, err := s.reads.roleOf(r.Context(), p.Person)
	if err != nil {
		return p, err
	}
	p.Role = role
	p.CanChange = role == roleOperator || role == roleApprover
	p.CanDecide = role == roleApprover
	p.Done = doneMessage(r.URL.Query())
	if p.CanDecide {
		p.Pending, err = s.reads.pendingCount(r.Context())
	}
	return p, err
}

func (s *server) render(w http.ResponseWriter, status int, name string, p page) {
	var buf bytes.Buffer
	if err := s.tmpl.ExecuteTemplate(&buf, name, p); err != nil {
		s.log.Error("console: render "+name, "err", err.Error())
		http.Error(w, "内部エラー", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail renders err on the error page: a refusal by the database as couponctl shows it, a
// form's mistake as 400, anything else as a generic 500 (the detail in the log).
func (s *server) fail(w http.ResponseWriter, r *http.Request, status int, subject string, err error, back string) {
	p, perr := s.newPage(r, "エラー")
	msg := err.Error()
	if status == 0 {
		var unexpected bool
		status, msg, unexpected = refusalOf(err)
		if unexpected {
			s.log.Error("console: "+subject, "path", r.URL.Path, "person", person(r), "err", err.Error())
		}
	}
	if perr != nil {
		s.log.Error("console: role", "err", perr.Error())
	}
	p.Error = msg
	p.Data = back
	s.render(w, status, "error.html", p)
}

func (s *server) listPage(w http.ResponseWriter, r *http.Request) {
	p, err := s.newPage(r, "キャンペーン一覧")
	if err == nil {
		p.Data, err = s.reads.list(r.Context())
	}
	if err != nil {
		s.fail(w, r, 0, "list", err, "/")
		return
	}
	s.render(w, http.StatusOK, "list.html", p)
}

// campaignView is the campaign page's data.
type campaignView struct {
	campaign.Status
	Funnel   Funnel
	Points   []Point
	Chart    template.HTML
	Requests []Request
	History  []HistoryRow
	// ApprovalAboveYen is the four-eyes line (coupon_rules.approval_above_yen), in yen: a raise
	// above it waits for a second approver.
	ApprovalAboveYen int64
	// PerMinute is the coupons issued a minute over the last 5 minutes: the forecast's pace.
	PerMinute float64
	typed     typedForm // a refused form, shown again as typed
}

func (s *server) campaignPage(w http.ResponseWriter, r *http.Request) {
	s.showCampaign(w, r, http.StatusOK, "", typedForm{})
}

// typedForm is a form the person sent that was refused: its action and what was typed, shown
// again in the form so that nothing typed is lost.
type typedForm struct {
	action string
	values url.Values
}

// Typed is what was typed in field of the form of action, "" unless that form was refused.
func (v campaignView) Typed(action, field string) string {
	if v.typed.action != action {
		return ""
	}
	return v.typed.values.Get(field)
}

// showCampaign renders campaign page of the path's id with status, and with a refusal: its
// message and the refused form as typed.
func (s *server) showCampaign(w http.ResponseWriter, r *http.Request, status int, refusal string, typed typedForm) {
	id := r.PathValue("id")
	p, err := s.newPage(r, "キャンペーン "+id)
	if err != nil {
		s.fail(w, r, 0, id, err, "/")
		return
	}
	st, err := campaign.Show(r.Context(), s.reads.pool, id)
	if errors.Is(err, campaign.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, id, fmt.Errorf("キャンペーン %s はありません", id), "/")
		return
	}
	var v campaignView
	if err == nil {
		v, err = s.campaignData(r.Context(), st)
	}
	if err != nil {
		s.fail(w, r, 0, id, err, "/")
		return
	}
	if st.Name != "" {
		p.Title = "キャンペーン " + id + "（" + st.Name + "）"
	}
	v.typed = typed
	p.Error, p.Data = refusal, v
	s.render(w, status, "campaign.html", p)
}

// campaignData is the campaign page's data for campaign st.
func (s *server) campaignData(ctx context.Context, st campaign.Status) (campaignView, error) {
	v := campaignView{Status: st}
	var err error
	if v.Funnel, err = s.reads.funnel(ctx, st.ID); err != nil {
		return v, err
	}
	if v.Points, err = s.reads.burndown(ctx, st, st.At); err != nil { // the last point at the database's clock
		return v, err
	}
	if v.Requests, err = s.reads.requests(ctx, st.ID); err != nil {
		return v, err
	}
	if v.History, err = s.reads.history(ctx, st.ID); err != nil {
		return v, err
	}
	if v.ApprovalAboveYen, err = s.reads.approvalLine(ctx); err != nil {
		return v, err
	}
	if v.PerMinute, err = s.reads.pace(ctx, st); err != nil {
		return v, err
	}
	v.Chart = newChart(st, v.Points, v.PerMinute).svg()
	return v, nil
}

func (s *server) burndownJSON(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	st, err := campaign.Show(r.Context(), s.reads.pool, id)
	var points []Point
	if err == nil {
		points, err = s.reads.burndown(r.Context(), st, st.At) // the last point at the database's clock
	}
	switch {
	case errors.Is(err, campaign.ErrNotFound):
		http.Error(w, "unknown campaign "+id, http.StatusNotFound)
		return
	case err != nil:
		s.log.Error("console: burndown", "campaign", id, "err", err.Error())
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	for i := range points {
		points[i].T = points[i].T.In(tokyo)
	}
	body, _ := json.Marshal(points)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// couponsView is a coupon page's, or a member's, data.
type couponsView struct {
	Member  string
	Coupons []coupon.Coupon
	// VoidedBy is the person who voided a coupon through the console, by coupon id.
	VoidedBy map[string]string
	// Redemptions is a coupon page's redemption history (its redeems and rollbacks, oldest
	// first), by coupon id; nil on a member's page, which shows none.
	Redemptions map[string][]coupon.Redemption
}

func (s *server) couponPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, err := s.newPage(r, "クーポン "+id)
	var c coupon.Coupon
	if err == nil {
		c, err = coupon.Show(r.Context(), s.reads.pool, id)
	}
	if errors.Is(err, coupon.ErrNotFound) || coupon.CheckID(id) != nil {
		s.fail(w, r, http.StatusNotFound, id, fmt.Errorf("クーポン %s はありません", id), "/")
		return
	}
	if err != nil {
		s.fail(w, r, 0, id, err, "/")
		return
	}
	v := couponsView{Member: c.MemberID, Coupons: []coupon.Coupon{c}}
	v.VoidedBy, err = s.reads.voidedByEmail(r.Context(), []string{c.ID})
	var history []coupon.Redemption
	if err == nil {
		history, err = coupon.Redemptions(r.Context(), s.reads.pool, c.ID)
	}
	if err != nil {
		s.fail(w, r, 0, id, err, "/")
		return
	}
	v.Redemptions = map[string][]coupon.Redemption{c.ID: history}
	p.Data = v
	s.render(w, http.StatusOK, "coupons.html", p)
}

func (s *server) memberPage(w http.ResponseWriter, r *http.Request) {
	member := r.PathValue("id")
	p, err := s.newPage(r, "会員 "+member+" のクーポン")
	var list []coupon.Coupon
	if err == nil {
		list, err = coupon.ForMember(r.Context(), s.reads.pool, member, "")
	}
	v := couponsView{Member: member, Coupons: list}
	if err == nil {
		ids := make([]string, len(list))
		for i, c := range list {
			ids[i] = c.ID
		}
		v.VoidedBy, err = s.reads.voidedByEmail(r.Context(), ids)
	}
	if err != nil {
		s.fail(w, r, 0, member, err, "/")
		return
	}
	p.Data = v
	s.render(w, http.StatusOK, "coupons.html", p)
}

// find goes to a coupon (a UUID) or a member's coupons (anything else).
func (s *server) find(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	switch {
	case q == "":
		http.Redirect(w, r, "/", http.StatusSeeOther)
	case uuid.Validate(q) == nil:
		http.Redirect(w, r, "/coupons/"+url.PathEscape(q), http.StatusSeeOther)
	default:
		http.Redirect(w, r, "/members/"+url.PathEscape(q), http.StatusSeeOther)
	}
}

// campaignAction runs pause, resume, end, budget or period on a campaign as the person who asked, then
// goes back to the campaign's page.
func (s *server) campaignAction(w http.ResponseWriter, r *http.Request) {
	id, action := r.PathValue("id"), r.PathValue("action")
	back := "/campaigns/" + url.PathEscape(id)
	f := form{r}
	refused := func(status int, msg string) { s.showCampaign(w, r, status, msg, typedForm{action, r.PostForm}) }
	reason, err := f.reason()
	if err != nil {
		refused(http.StatusBadRequest, err.Error())
		return
	}
	ctx, who := r.Context(), person(r)
	if action == "end" && !confirmed(r) {
		s.confirmEnd(w, r, id, reason, back)
		return
	}
	var out outcome
	switch action {
	case "pause", "resume", "end":
		out, err = s.actions.state(ctx, id, action, who, reason)
	case "budget":
		set, add, stripes, ferr := f.budgetArgs()
		if ferr != nil {
			refused(http.StatusBadRequest, ferr.Error())
			return
		}
		out, err = s.actions.budget(ctx, id, set, add, stripes, who, reason)
	case "period":
		starts, ends, ferr := f.periodArgs()
		if ferr != nil {
			refused(http.StatusBadRequest, ferr.Error())
			return
		}
		out, err = s.actions.period(ctx, id, starts, ends, who, reason)
	default:
		s.notFound(w, r)
		return
	}
	if err != nil {
		if status, msg, unexpected := refusalOf(err); !unexpected && status != http.StatusNotFound {
			refused(status, msg) // the database's refusal, beside the form as typed
			return
		}
		s.fail(w, r, 0, "campaign "+id, err, back)
		return
	}
	s.log.Info("console: "+action, "campaign", id, "person", who)
	http.Redirect(w, r, back+"?"+out.query(), http.StatusSeeOther)
}

// decide approves or rejects a pending change request as the person who asked.
func (s *server) decide(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	rid, err := strconv.ParseInt(r.PathValue("rid"), 10, 64)
	if err != nil || (action != "approve" && action != "reject") {
		s.notFound(w, r)
		return
	}
	back := "/campaigns/" + url.PathEscape(r.PostFormValue("campaign_id"))
	if r.PostFormValue("from") == "requests" {
		back = "/requests" // decided from the inbox: back to it
	}
	reason, err := form{r}.reason()
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "", err, back)
		return
	}
	var n int
	if err := s.actions.call(r.Context(), sqlDecide, []any{rid, action == "approve", person(r), reason}, &n); err != nil {
		s.fail(w, r, 0, fmt.Sprintf("request %d", rid), err, back)
		return
	}
	s.log.Info("console: "+action, "request", rid, "person", person(r))
	http.Redirect(w, r, back+"?"+outcome{done: action, requestID: rid}.query(), http.StatusSeeOther)
}

// void voids a coupon as the person who asked, with or without reissue.
func (s *server) void(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	back := "/coupons/" + url.PathEscape(id)
	reason, err := form{r}.reason()
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, id, err, back)
		return
	}
	if coupon.CheckID(id) != nil {
		s.fail(w, r, http.StatusNotFound, id, fmt.Errorf("クーポン %s はありません", id), "/")
		return
	}
	reissue := r.PostFormValue("allow_reissue") != ""
	if !confirmed(r) {
		s.confirmVoid(w, r, id, reason, reissue, back)
		return
	}
	if err := s.actions.voidCoupon(r.Context(), id, reissue, person(r), reason); err != nil {
		s.fail(w, r, 0, "coupon "+id, err, back)
		return
	}
	done := "void"
	if reissue {
		done = "void_reissue"
	}
	s.log.Info("console: void", "coupon", id, "reissue", reissue, "person", person(r))
	http.Redirect(w, r, back+"?"+outcome{done: done}.query(), http.StatusSeeOther)
}

// inbox is every request waiting for an approver, across campaigns, each with its requester and
// reason, the campaign's budget or period now and after, and the time left before it lapses.
func (s *server) inbox(w http.ResponseWriter, r *http.Request) {
	p, err := s.newPage(r, "承認待ちの申請")
	var v inboxView
	if err == nil {
		v.Requests, err = s.reads.pendingRequests(r.Context())
	}
	if err == nil {
		v.ApprovalAboveYen, err = s.reads.approvalLine(r.Context())
	}
	if err != nil {
		s.fail(w, r, 0, "requests", err, "/")
		return
	}
	v.Now = time.Now()
	p.Data = v
	s.render(w, http.StatusOK, "requests.html", p)
}

// inboxView is the inbox's data.
type inboxView struct {
	Requests         []Pending
	ApprovalAboveYen int64
	Now              time.Time
}

// confirmation is the page that asks before a change that cannot be undone (an end, a void):
// the same form again, its fields kept, with confirm=yes. No script needed.
type confirmation struct {
	Action, Path, Back, Question, Button, Reason string
	Facts                                        []string
	Hidden                                       map[string]string
}

// confirmed says the form came from a [confirmation] page.
func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "yes" }

// confirmEnd asks before ending campaign id, saying what the end does and where it stands.
func (s *server) confirmEnd(w http.ResponseWriter, r *http.Request, id, reason, back string) {
	p, err := s.newPage(r, "キャンペーン "+id+" を終了しますか")
	var st campaign.Status
	if err == nil {
		st, err = campaign.Show(r.Context(), s.reads.pool, id)
	}
	if err != nil {
		s.fail(w, r, 0, id, err, back)
		return
	}
	p.Data = confirmation{Action: "end", Path: r.URL.Path, Back: back, Reason: reason, Button: "終了する",
		Question: "このキャンペーンを今すぐ終了します。終了すると一時停止と違い再開できず、クーポンは配布されません（再び配布するには期間の変更の申請と承認が必要です）。",
		Facts: []string{"状態: " + stateJa(st.State), fmt.Sprintf("配布数: %s 枚、残り枚数: %s 枚", groupDigits(issuedCoupons(st)), groupDigits(st.RemainingCoupons)),
			"配布済みのクーポンは有効なままです。"}}
	s.render(w, http.StatusOK, "confirm.html", p)
}

// confirmVoid asks before voiding coupon id.
func (s *server) confirmVoid(w http.ResponseWriter, r *http.Request, id, reason string, reissue bool, back string) {
	p, err := s.newPage(r, "クーポンを無効化しますか")
	if err != nil {
		s.fail(w, r, 0, id, err, back)
		return
	}
	c := confirmation{Action: "void", Path: r.URL.Path, Back: back, Reason: reason, Button: "無効化する",
		Question: "クーポン " + id + " を無効化します。無効化したクーポンは使えなくなり、元に戻せません。",
		Facts:    []string{"同じ会員への再発行: 許可しない"}}
	if reissue {
		c.Facts = []string{"同じ会員への再発行: 許可する"}
		c.Hidden = map[string]string{"allow_reissue": "1"}
	}
	p.Data = c
	s.render(w, http.StatusOK, "confirm.html", p)
}

// notFound answers a path the console does not serve: 404 on the error page.
func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, http.StatusNotFound, "", errors.New("このページはありません"), "/")
}

// csrfRefused answers a POST without a valid CSRF token: 403, nothing done.
func (s *server) csrfRefused(w http.ResponseWriter, r *http.Request) {
	s.log.Info("console: CSRF refused", "path", r.URL.Path, "reason", csrf.FailureReason(r).Error())
	s.fail(w, r, http.StatusForbidden, "", errors.New("このフォームは古いか、このコンソールのページから送られていません。ページを読み込み直してからやり直してください。何も変更していません。"), "/")
}

func (o outcome) query() string {
	q := url.Values{"done": {o.done}}
	if o.requestID != 0 {
		q.Set("request", strconv.FormatInt(o.requestID, 10))
	}
	return q.Encode()
}

// doneMessages are the messages after a change, by the redirect's done.
var doneMessages = map[string]string{
	"pause":            "一時停止しました。これ以降、このキャンペーンのクーポンは発行されません。",
	"resume":           "再開しました。",
	"end":              "終了しました。",
	"budget":           "予算を変更しました。",
	"unchanged":        "既にその状態です。何も変更していません。",
	"requested":        "予算の増額が承認基準を超えるため、承認待ちの申請 #%s になりました。別の承認者が承認するまで反映されません。",
	"requested_period": "期間の変更は承認待ちの申請 #%s になりました。別の承認者が承認するまで反映されません。",
	"approve":          "申請 #%s を承認し、反映しました。",
	"reject":           "申請 #%s を却下しました。",
	"void":             "クーポンを無効化しました（再発行なし）。",
	"void_reissue":     "クーポンを無効化しました。この会員は再発行を受けられます。",
}

func doneMessage(q url.Values) string {
	m, ok := doneMessages[q.Get("done")]
	if !ok {
		return ""
	}
	if strings.Contains(m, "%s") {
		rid, err := strconv.ParseInt(q.Get("request"), 10, 64)
		if err != nil {
			return ""
		}
		return fmt.Sprintf(m, strconv.FormatInt(rid, 10))
	}
	return m
}
