package main

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/shared/issuance"
)

// scenarios are the loads `couponctl sim --scenario` runs.
var scenarios = []string{"silver-week", "black-friday"}

// blackFridayFlags are the flags only the black-friday scenario reads.
type blackFridayFlags struct {
	load isolationlab.FirstCome
}

func (b *blackFridayFlags) register(f *pflag.FlagSet) {
	b.load = isolationlab.BlackFriday()
	f.IntVar(&b.load.BudgetCoupons, "bf-coupons", b.load.BudgetCoupons, "black-friday: the first-come campaign's budget in coupons")
	f.IntVar(&b.load.Instances, "bf-instances", b.load.Instances, "black-friday preallocated: instances leasing budget slices")
	f.IntVar(&b.load.LeaseCoupons, "bf-lease", b.load.LeaseCoupons, "black-friday preallocated: coupons per leased slice")
	f.IntVar(&b.load.KillAfter, "bf-kill-after", b.load.KillAfter,
		"black-friday preallocated: instance 0 dies after issuing this many coupons, stranding its slice (0: none dies)")
}

// runBlackFriday runs `couponctl sim --scenario black-friday`: --strategies, --workers and
// --members default to the scenario's own (good, stripes-16, preallocated, serializable; 64 and
// 256 workers; 20,000 members) unless given; --discount-yen, --cap-yen, --seed, --runs and
// --format apply as for Silver Week (the cap 2,000 yen when --cap-yen is not given).
func runBlackFriday(cmd *cobra.Command, strategies []string, workers []int, members, discountYen, capYen, runs int,
	seed uint64, format string, b blackFridayFlags) error {
	plan, err := blackFridayPlan(cmd, strategies, workers, members, discountYen, capYen, runs, seed, format, b)
	if err != nil {
		return err
	}
	fresh, stop, err := labServer(cmd)
	if err != nil {
		return err
	}
	defer stop()
	plan.Fresh = fresh
	ms, err := isolationlab.RunFirstComePlan(cmd.Context(), plan)
	if err != nil {
		return err
	}
	return isolationlab.WriteFirstComeTable(cmd.OutOrStdout(), format, ms)
}

// blackFridayPlan checks runBlackFriday's flags and turns them into the lab's plan, without
// its fresh databases; a Silver Week flag, a bad --format, --runs or --workers, a load that
// [isolationlab.FirstCome.Validate] refuses or an unknown strategy is an error.
func blackFridayPlan(cmd *cobra.Command, strategies []string, workers []int, members, discountYen, capYen, runs int,
	seed uint64, format string, b blackFridayFlags) (isolationlab.FirstComePlan, error) {
	flags := cmd.Flags()
	for _, name := range []string{"campaigns", "budgets", "tap-gap", "chart"} {
		if flags.Changed(name) {
			return isolationlab.FirstComePlan{}, flagError("--%s: the black-friday scenario has one campaign, one tap per member and no chart (use --bf-coupons)", name)
		}
	}
	if !flags.Changed("workers") {
		workers = []int{64, 256}
	}
	load := blackFridayLoad(flags, b.load, members, discountYen, capYen, seed)
	if !slices.Contains(isolationlab.Formats, format) {
		return isolationlab.FirstComePlan{}, flagError("--format %q: want one of %s", format, strings.Join(isolationlab.Formats, ", "))
	}
	if runs < 1 || len(workers) == 0 || slices.Min(workers) < 1 {
		return isolationlab.FirstComePlan{}, flagError("--runs and every --workers must be at least 1")
	}
	if err := load.Validate(); err != nil {
		return isolationlab.FirstComePlan{}, err
	}
	s, err := firstComeStrategies(flags, strategies)
	if err != nil {
		return isolationlab.FirstComePlan{}, err
	}
	return isolationlab.FirstComePlan{Strategies: s, Workers: workers, Runs: runs, Load: load, Progress: cmd.ErrOrStderr()}, nil
}

// blackFridayLoad is load with the Silver Week flags the scenario shares set on it where given:
// --members, --discount-yen and --seed, and --cap-yen (the default cap when 0).
func blackFridayLoad(flags *pflag.FlagSet, load isolationlab.FirstCome, members, discountYen, capYen int, seed uint64) isolationlab.FirstCome {
	if flags.Changed("members") {
		load.Members = members
	}
	if flags.Changed("discount-yen") {
		load.DiscountYen = discountYen
	}
	if flags.Changed("seed") {
		load.Seed = seed
	}
	if capYen == 0 {
		capYen = issuance.DefaultMonthlyCapYen
	}
	load.CapYen = capYen
	return load
}

// firstComeStrategies are the strategies names lists, or every first-come strategy without
// --strategies; an unknown name is an error.
func firstComeStrategies(flags *pflag.FlagSet, names []string) ([]isolationlab.FirstComeStrategy, error) {
	if !flags.Changed("strategies") {
		return slices.Clone(isolationlab.FirstComeStrategies), nil
	}
	var strategies []isolationlab.FirstComeStrategy
	for _, name := range names {
		s, err := isolationlab.FirstComeStrategyNamed(name)
		if err != nil {
			return nil, err
		}
		strategies = append(strategies, s)
	}
	return strategies, nil
}
