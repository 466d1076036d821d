package audit

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/mops/coupon-api/shared/issuance"
)

// stateSpan is a campaign's period and pause as its budget stripes held them from from on, until
// the next span's from (campaign_changes, 00010_live_campaigns.sql).
type stateSpan struct {
	from                       time.Time // zero for the first span: since the campaign began
	startsAt, endsAt, pausedAt *time.Time
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

// change is a row of campaign_changes as the audit reads it.
type change struct {
	at            time.Time
	what          string
	before, after []byte
}

// newHistory builds a campaign's history from its stripe 0 now and its changes, oldest first.
func newHistory(now stateSpan, changes []change) (*history, error) {
	h := &history{}
	var states []change
	for _, c := range changes {
		switch c.what {
		case "budget", "stripes":
			h.budgetLaidAt = c.at
			continue
		case "repair": // counters rebuilt from the coupons: no change of state or budget
			continue
		}
		states = append(states, c)
	}
	if len(states) == 0 {
		h.spans = []stateSpan{now}
		return h, nil
	}
	var first stateJSON
	if err := json.Unmarshal(states[0].before, &first); err != nil {
		return nil, err
	}
	h.spans = []stateSpan{{startsAt: first.StartsAt, endsAt: first.EndsAt, pausedAt: first.PausedAt}}
	for _, c := range states {
		var s stateJSON
		if err := json.Unmarshal(c.after, &s); err != nil {
			return nil, err
		}
		h.spans = append(h.spans, stateSpan{from: c.at, startsAt: s.StartsAt, endsAt: s.EndsAt, pausedAt: s.PausedAt})
	}
	return h, nil
}

// reasonAt is why a campaign in state s issued nothing at t ("" when it was active), as
// issue_coupon's campaign_inactive_reason judges it.
func (s stateSpan) reasonAt(t time.Time) string {
	switch {
	case s.endsAt != nil && !t.Before(*s.endsAt):
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
	return !lo.After(hi) && (s.endsAt == nil || lo.Before(*s.endsAt))
}
