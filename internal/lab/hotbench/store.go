package hotbench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// RedeemFunc sends one redeem of a coupon by its member for an order to RedeemCoupon and returns
// the result code it answered.
type RedeemFunc func(ctx context.Context, couponID, memberID, orderID string) (string, error)

// StoreOpening is the store-opening cell (issue 41): IssueCoupon on a hot campaign of 16 stripes
// for Config.Duration at the cell's clients, alone, then beside Herd clients redeeming distinct
// coupons of another campaign through RedeemCoupon (Config.Redeem) at Rate a second; Rounds times
// each, in turns, so that the machine's other load falls on both alike, a new hot campaign each
// turn. The redemption's lock is the coupon's row: the hot campaign's rate and p99 beside must
// stay within the turns' spread alone.
type StoreOpening struct {
	Herd, Rounds int
	Rate         float64 // redemptions a second, at most
}

// StoreRush is the cell of `couponctl bench --store-opening`: 2,000 redemptions a second of
// distinct coupons from 32 clients, three turns each.
var StoreRush = StoreOpening{Herd: 32, Rate: 2000, Rounds: 3}

// StoreResult is one store-opening cell.
type StoreResult struct {
	RTT     time.Duration `json:"rtt_ns"`
	Clients int           `json:"clients"`
	Herd    int           `json:"herd"`
	// Alone and Beside are the hot campaign's ISSUED answers per second of each turn, and their
	// p99 latencies in ms; Ratio is Beside's median rate over Alone's.
	Alone, Beside       []float64
	AloneP99, BesideP99 []float64
	Ratio               float64
	// RedeemedPerSec is the REDEEMED answers per second beside the load, all turns;
	// RedeemP99Ms their p99; RedeemFailed those answered otherwise or not at all.
	RedeemedPerSec float64
	RedeemP99Ms    float64
	RedeemFailed   int64
	// Failed is the hot campaign's requests answered other than ISSUED or without an answer.
	Failed int64
	// PGPerCoupon and PGPerRedemption are the database server's core-ms per coupon issued alone,
	// and per redemption (its CPU beside less the coupons beside at PGPerCoupon); 0 without
	// Config.ServerCPU.
	PGPerCoupon, PGPerRedemption float64
	// Rules is "held", or what the check after the cell found: the rules, the hot campaigns'
	// coupons, and the redeemed coupons against the REDEEMED answers.
	Rules string
}

// storeTurn is one turn of the cell, or the sum of several.
type storeTurn struct {
	issued, failed, redeemed, redeemFailed int64
	wall                                   time.Duration
	pgMs                                   float64
}

func (t *storeTurn) add(o storeTurn) {
	t.issued += o.issued
	t.failed += o.failed
	t.redeemed += o.redeemed
	t.redeemFailed += o.redeemFailed
	t.wall += o.wall
	t.pgMs += o.pgMs
}

// sqlStoreCoupons issues $2 coupons of 1 yen of campaign $1 to members s<campaign>-1.. in one
// statement, with their month rows, outbox rows (already sent: the store opens after the
// pushes) and the campaign's counter, as the issuance would have written them: the coupons the
// store-opening's redemptions use.
const sqlStoreCoupons = `
WITH c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT $1, 's' || $1 || '-' || g, to_char(issue_now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1
    FROM generate_series(1, $2) g
  RETURNING coupon_id, member_id, month),
u AS (INSERT INTO member_monthly_usage (member_id, month, used_yen) SELECT member_id, month, 1 FROM c),
o AS (INSERT INTO notification_outbox (coupon_id, member_id, sent_at, attempts) SELECT coupon_id, member_id, issue_now(), 1 FROM c)
UPDATE campaign_budgets SET issued_yen = issued_yen + $2 WHERE campaign_id = $1`

// runStore runs the store-opening cell at round trip rtt (set on the proxy) with clients clients.
func (s *session) runStore(ctx context.Context, rtt time.Duration, clients int) (StoreResult, error) {
	so := s.cfg.Store
	r := StoreResult{RTT: rtt, Clients: clients, Herd: so.Herd}
	store := fmt.Sprintf("STORE-%dns-%d", rtt.Nanoseconds(), clients)
	coupons, err := s.storeCoupons(ctx, store, int(so.Rate*s.cfg.Duration.Seconds())*so.Rounds+so.Herd*so.Rounds)
	if err != nil {
		return r, err
	}
	var next atomic.Int64 // the next unused coupon of coupons
	var alone, beside storeTurn
	var redeemLat []time.Duration
	var wrong []string
	for round := range so.Rounds {
		for _, besides := range []bool{false, true} {
			id := fmt.Sprintf("SHOP-%dns-%d-%d-%t", rtt.Nanoseconds(), clients, round, besides)
			t, hotLat, lat, rules, err := s.storeTurn(ctx, id, clients, besides, coupons, &next)
			if err != nil {
				return r, err
			}
			if rules != "held" {
				wrong = append(wrong, rules)
			}
			r.Failed += t.failed
			perSec := float64(t.issued) / t.wall.Seconds()
			if besides {
				r.Beside, r.BesideP99 = append(r.Beside, perSec), append(r.BesideP99, percentileMs(hotLat, 99))
				redeemLat = append(redeemLat, lat...)
				beside.add(t)
			} else {
				r.Alone, r.AloneP99 = append(r.Alone, perSec), append(r.AloneP99, percentileMs(hotLat, 99))
				alone.add(t)
			}
		}
	}
	if a := median(r.Alone); a > 0 {
		r.Ratio = median(r.Beside) / a
	}
	r.RedeemedPerSec = float64(beside.redeemed) / beside.wall.Seconds()
	r.RedeemP99Ms = percentileMs(redeemLat, 99)
	r.RedeemFailed = beside.redeemFailed
	if alone.issued > 0 && beside.redeemed > 0 {
		r.PGPerCoupon = alone.pgMs / float64(alone.issued)
		r.PGPerRedemption = (beside.pgMs - float64(beside.issued)*r.PGPerCoupon) / float64(beside.redeemed)
	}
	var redeemed int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons WHERE campaign_id = $1 AND redeemed_at IS NOT NULL`,
		store).Scan(&redeemed); err != nil {
		return r, err
	}
	if redeemed != beside.redeemed {
		wrong = append(wrong, fmt.Sprintf("%s: %d coupons redeemed for %d REDEEMED answers", store, redeemed, beside.redeemed))
	}
	r.Rules = "held"
	if len(wrong) > 0 {
		r.Rules = strings.Join(wrong, "; ")
	}
	return r, nil
}

// storeCoupons creates campaign store with n coupons of 1 yen, each of a member of its own
// (sqlStoreCoupons), and returns them.
func (s *session) storeCoupons(ctx context.Context, store string, n int) ([][2]string, error) {
	c := campaign.Campaign{ID: store, DiscountYen: 1, BudgetYen: n}
	if err := campaign.Create(ctx, s.pool, c); err != nil {
		return nil, err
	}
	if _, err := s.pool.Exec(ctx, sqlStoreCoupons, store, n); err != nil {
		return nil, fmt.Errorf("store coupons: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT coupon_id::text, member_id FROM issued_coupons WHERE campaign_id = $1`, store)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (c [2]string, err error) {
		return c, row.Scan(&c[0], &c[1])
	})
}

// storeTurn runs one turn on hot campaign id: its load of clients clients, beside the
// redemptions when beside, each of the next unused coupon of coupons; it returns the turn, the
// hot campaign's ISSUED latencies, the REDEEMED latencies and the rules' check.
func (s *session) storeTurn(ctx context.Context, id string, clients int, beside bool, coupons [][2]string,
	next *atomic.Int64) (storeTurn, []time.Duration, []time.Duration, string, error) {
	var t storeTurn
	if err := campaign.Create(ctx, s.pool, benchCampaign(id, 16)); err != nil {
		return t, nil, nil, "", err
	}
	stop := make(chan struct{})
	var herd sync.WaitGroup
	var lat []time.Duration
	if beside {
		limit := rate.NewLimiter(rate.Limit(s.cfg.Store.Rate), 1)
		herd.Go(func() {
			lat, t.redeemFailed = redeemLoop(ctx, s.cfg.Redeem, s.cfg.Store.Herd, coupons, next, limit, stop)
		})
	}
	var done []time.Duration
	pgMs, err := s.serverCPU(func() (err error) {
		done, t.failed, t.wall, err = closedLoop(ctx, s.cfg.Issue, clients, s.cfg.Duration, id)
		return err
	})
	close(stop)
	herd.Wait()
	if err != nil {
		return t, nil, nil, "", err
	}
	t.issued, t.redeemed, t.pgMs = int64(len(done)), int64(len(lat)), pgMs
	rules, err := checkRules(ctx, s.pool, id, t.issued)
	return t, done, lat, rules, err
}

// redeemLoop keeps up to clients redemptions in flight, each of the next unused coupon of
// coupons for an order of its own, each sent when limit allows, until stop or the coupons run
// out (see [herdLoop]), and returns the latencies of the REDEEMED answers and the count of the
// others.
func redeemLoop(ctx context.Context, redeem RedeemFunc, clients int, coupons [][2]string, next *atomic.Int64,
	limit *rate.Limiter, stop <-chan struct{}) ([]time.Duration, int64) {
	return herdLoop(ctx, clients, limit, stop, func() (bool, bool) {
		i := next.Add(1) - 1
		if i >= int64(len(coupons)) {
			return false, false
		}
		res, err := redeem(ctx, coupons[i][0], coupons[i][1], "STORE-"+strconv.FormatInt(i, 10))
		return err == nil && res == "REDEEMED", true
	})
}

// writeStore writes the store-opening cells, if any, as a table after a blank line.
func writeStore(w io.Writer, format string, serverCPU bool, cells []StoreResult) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := [][]string{{"rtt", "clients", "redeem clients", "issued/s alone", "issued/s beside", "beside / alone",
		"p99 ms alone", "p99 ms beside", "redeemed/s", "redeem p99 ms", "failed", "redeems failed", "rules"}}
	align := "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
	if serverCPU {
		rows[0] = append(rows[0], "PG core-ms per coupon alone", "PG core-ms per redemption")
		align += "---:|---:|"
	}
	for _, r := range cells {
		row := []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), strconv.Itoa(r.Herd), rateList(r.Alone), rateList(r.Beside),
			fmtFloat(r.Ratio, 2), msList(r.AloneP99), msList(r.BesideP99), fmtFloat(r.RedeemedPerSec, 0), fmtFloat(r.RedeemP99Ms, 1),
			strconv.FormatInt(r.Failed, 10), strconv.FormatInt(r.RedeemFailed, 10), r.Rules}
		if serverCPU {
			row = append(row, fmtFloat(r.PGPerCoupon, 3), fmtFloat(r.PGPerRedemption, 3))
		}
		rows = append(rows, row)
	}
	return writeRows(w, format, rows, align)
}

// msList is latencies in ms with one decimal, in brackets: a store-opening cell's turns.
func msList(ms []float64) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmtFloat(m, 1)
	}
	return fmt.Sprint(out)
}
