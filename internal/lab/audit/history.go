package audit

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/mops/coupon-api/shared/issuance"
)

// stateSpan is a campaign's period, pause and fixed coupon expiry as its budget stripes held them
// from from on, until the next span's from (campaign_changes, 00010_live_campaigns.sql and
// 00011_after_issuance.sql).
type stateSpan struct {
	from                       time.Time // zero for the first span: since the campaign began
	startsAt, endsAt, pausedAt *time.Time
	expireAt                   *time.Time // coupons_expire_at: the campaign ends there too (00015_expiry.sql)
}

// history is what the audit knows of a campaign's changes: the spans of its state, oldest first,
// and when its budget or stripes last changed (zero if never).
type history struct {
	spans        []stateSpan
	budgetLaidAt time.Time
}

// stateJSON is the before and after of a period, pause, resume or end change.
type stateJSON struct {
	StartsAt *time.Time `json:"starts_at"`
	EndsAt   *time.Time `json:"ends_at"`
	PausedAt *time.Time `json:"paused_at"`
}

// validityJSON is the before and after of a validity change.
type validityJSON struct {
	CouponsExpireAt *time.Time `json:"coupons_expire_at"`
}

// change is a row of campaign_changes as the audit reads it.
type change struct {
	at            time.Time
	what          string
	before, after []byte
}

// newHistory builds a campaign's history from its stripe 0 now and its changes, oldest first: the
// first span is the state before the first change of each kind (period and pause, validity), and
// each change starts a span that keeps what it did not change.
func newHistory(now stateSpan, changes []change) (*history, error) {
	h := &history{}
	first := now
	var seenState, seenValidity bool
	for _, c := range changes {
		var err error
		switch {
		case c.what == "budget" || c.what == "stripes":
			h.budgetLaidAt = c.at
		case c.what == "repair": // counters rebuilt from the coupons: no change of state or budget
		case c.what == "validity" && !seenValidity:
			seenValidity = true
			err = first.set(c.what, c.before)
		case c.what != "validity" && !seenState:
			seenState = true
			err = first.set(c.what, c.before)
		}
		if err != nil {
			return nil, err
		}
	}
	h.spans = []stateSpan{first}
	for _, c := range changes {
		if c.what == "budget" || c.what == "stripes" || c.what == "repair" {
			continue
		}
		s := h.spans[len(h.spans)-1]
		s.from = c.at
		if err := s.set(c.what, c.after); err != nil {
			return nil, err
		}
		h.spans = append(h.spans, s)
	}
	return h, nil
}

// set sets on s what a change of kind what records in state, its before or after: the fixed
// coupon expiry for a validity change, else the period and the pause.
func (s *stateSpan) set(what string, state []byte) error {
	if what == "validity" {
		var v validityJSON
		if err := json.Unmarshal(state, &v); err != nil {
			return err
		}
		s.expireAt = v.CouponsExpireAt
		return nil
	}
	var st stateJSON
	if err := json.Unmarshal(state, &st); err != nil {
		return err
	}
	s.startsAt, s.endsAt, s.pausedAt = st.StartsAt, st.EndsAt, st.PausedAt
	return nil
}

// reasonAt is why a campaign in state s issued nothing at t ("" when it was active), as
// campaign_inactive_reason (00015_expiry.sql) judges it.
func (s stateSpan) reasonAt(t time.Time) string {
	switch {
	case s.endsAt != nil && !t.Before(*s.endsAt), s.expireAt != nil && !t.Before(*s.expireAt):
		return issuance.ReasonEnded
	case s.pausedAt != nil:
		return issuance.ReasonPaused
	case s.startsAt != nil && t.Before(*s.startsAt):
		return issuance.ReasonNotStarted
	}
	return ""
}

// reasons lists the reasons of CAMPAIGN_NOT_ACTIVE that the campaign's state gave at some instant
// of [from, to], with "" among them when it was active at some instant of it. Within a span the
// state's bounds are fixed, so its reasons at the ends of the overlap are all it gave.
func (h *history) reasons(from, to time.Time) []string {
	var out []string
	for i, s := range h.spans {
		lo, hi := s.from, to
		if i+1 < len(h.spans) {
			hi = h.spans[i+1].from
		}
		if i == 0 || lo.Before(from) {
			lo = from
		}
		if hi.After(to) {
			hi = to
		}
		if hi.Before(lo) {
			continue
		}
		rs := []string{s.reasonAt(lo), s.reasonAt(hi)}
		if s.activeWithin(lo, hi) {
			rs = append(rs, "")
		}
		for _, r := range rs {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

// activeWithin reports whether the campaign in state s was active at some instant of [lo, hi].
func (s stateSpan) activeWithin(lo, hi time.Time) bool {
	if s.pausedAt != nil {
		return false
	}
	if s.startsAt != nil && s.startsAt.After(lo) {
		lo = *s.startsAt
	}
	return !lo.After(hi) && (s.endsAt == nil || lo.Before(*s.endsAt)) && (s.expireAt == nil || lo.Before(*s.expireAt))
}
