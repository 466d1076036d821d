-- +goose Up
-- Every function's contract is its COMMENT ON FUNCTION (issue 39, item 3): what it does, its
-- arguments and their units, what it answers, its errors (SQLSTATE and when), and where its rule
-- comes from. `go generate ./schema/current` prints it above the function's current text, and
-- TestEveryFunctionHasAContract (schema/current) fails on a function without one: a migration that
-- creates a function gives it its comment. The text comes from the headers of the migrations that
-- created or replaced each function, which now point here, checked against each current body.
-- Comments only: no body is replaced (CREATE OR REPLACE would keep a comment, DROP loses it), and
-- COMMENT ON FUNCTION waits for no call in flight.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- The issuance.

COMMENT ON FUNCTION issue_coupons_batch_v2(text, uuid[], text[], timestamptz[], integer, text[]) IS
$$The issuance: the one body of R1 (budget), R2 (one coupon per member), R3 (monthly cap), voids,
validity, the campaign's state, releases and audiences, which every issuance runs (IssueCoupon,
a request alone as a batch of one and a coalesced group as one call, couponctl grant through
grant_coupons_batch_v2, the previous release through its wrappers). It issues campaign
p_campaign_id to each member p_member_ids[k], with coupon id p_coupon_ids[k] (made by the caller,
so that it can find its coupon when the answer is lost) and p_trace_parents[k] (a W3C traceparent,
or NULL) on the coupon's outbox row, in one transaction that commits as the call returns.
p_issued_at[k] is the caller's clock, refused beyond issue_clock_skew() (5 s): the database's clock
decides the issue time, its Asia/Tokyo month (YYYY-MM, R3's) and the coupon's expiry
(issue_clock). p_cap_yen is ignored: R3's cap is coupon_rules' (monthly_cap_yen), read first,
before any row lock.
It answers one row per entry, i from 1: result, coupon (the new coupon on ISSUED, the member's
own on ALREADY_ISSUED, the voided one on COUPON_VOIDED), amount (yen, on ISSUED), reason (ENDED,
PAUSED or NOT_STARTED, on CAMPAIGN_NOT_ACTIVE), expires_at (the coupon's, NULL without validity)
and next_release_at (release_next, on BUDGET_EXCEEDED and on NOT_STARTED). The results, in the
order judged: UNKNOWN_CAMPAIGN, ALREADY_ISSUED or COUPON_VOIDED, NOT_ELIGIBLE (audience-only, the
member not in campaign_audience), CAMPAIGN_NOT_ACTIVE (campaign_inactive_reason, or NOT_STARTED
before the first release), MONTHLY_CAP, BUDGET_EXCEEDED (no stripe with room, or every released
coupon taken), ISSUED, and RETRY for a member it could not place without waiting out of lock
order: the caller sends it again with the same coupon id. A member given twice is answered once,
its later entries as its first (ALREADY_ISSUED when it was issued). A refusal raises nothing: a
member refused after its rows were written (a race, a stripe short) has them deleted in the same
transaction, so a refused member writes nothing that commits, and the others are not held back.
Reads first, of the committed state, none locking but the audience rows, held FOR KEY SHARE to the
COMMIT so that an audience removal waits for the member's issuance. Then the writes, in the one
lock order: the coupons in member order (R2, the unique index one_coupon_per_member), the
member x month rows in member order (R3, an upsert only while used_yen + amount <= the cap), the
outbox rows, and last the budget stripes (R1): first any stripe with room that nobody holds (FOR
UPDATE SKIP LOCKED), then a wait only for a stripe above every stripe held. Each stripe's write is
judged on the row it writes, at the database's clock: its room, the campaign's period, pause and
fixed expiry (campaign_inactive_reason), and, for a campaign with releases, its share of the
coupons released by then (release_room), so no change, pause or release is overtaken.
Errors: 22023 for arguments shared/issuance never sends (issuance_args_check) and for an issue time
off the database's clock (issue_clock). 55P03 when a lock waits past the caller's lock_timeout,
57014 past its statement_timeout: the call wrote nothing, and shared/issuance sends it again
(Service.run, shared/issuance/run.go).
Rules: docs/api.md, "The rules and the row that serializes each"; docs/design.md, "One lock row
per invariant", "Lock order", "Coalescing a hot campaign", "Changing a live campaign", "Releases,
audiences and the dry run", "Voids, expiry and grants". SECURITY DEFINER, executable by
coupon_issue.$$;

COMMENT ON FUNCTION grant_coupons_batch_v2(text, uuid[], text[], timestamptz[], integer, text[]) IS
$$couponctl grant's issuance, an operator's bulk grant: issue_coupons_batch_v2 with the same
arguments, answers and errors, never coalesced (shared/issuance sends a batch of one), and each
coupon it issues records the database login that granted it (issued_coupons.granted_by, the
session_user). The granted_by updates touch only the rows this call inserted, after the stripes:
no lock is waited for out of the issuance's order. Rules: docs/design.md, "Voids, expiry and
grants" and "Lock order". SECURITY DEFINER, executable by coupon_admin alone: a grant is an
operator's act, as a void is.$$;

COMMENT ON FUNCTION issue_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) IS
$$The previous release's coalesced issuance (980de4a calls it for a group), kept as a thin wrapper
(docs/deploy.md, "Releases"): issue_coupons_batch_v2 with the same arguments, answering the
result columns that release knows (i, result, coupon, amount, reason, expires_at: no
next_release_at) and only codes it knows: NOT_ELIGIBLE is answered UNKNOWN_CAMPAIGN (the campaign
does not exist for that member, nothing was written, and sending again changes nothing). RETRY
is answered as it is: that release sends the member again. Its p_cap_yen is ignored and its
p_issued_at judged as issue_coupons_batch_v2 judges them. Errors: issue_coupons_batch_v2's.
SECURITY DEFINER, executable by coupon_issue.$$;

COMMENT ON FUNCTION grant_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) IS
$$The previous release's grant of a batch (grant_coupon calls it), kept as a thin wrapper
(docs/deploy.md, "Releases"): grant_coupons_batch_v2 answered as issue_coupons_batch answers
issue_coupons_batch_v2 (no next_release_at, NOT_ELIGIBLE as UNKNOWN_CAMPAIGN). Errors:
issue_coupons_batch_v2's. SECURITY DEFINER, executable by coupon_admin.$$;

COMMENT ON FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text) IS
$$The previous release's issuance of one member (980de4a's IssueCoupon calls it for a request
alone; couponctl bench's pgbench script too), kept as a thin wrapper (docs/deploy.md,
"Releases"): issue_coupons_batch for a batch of one, member p_member_id of campaign
p_campaign_id with coupon id p_coupon_id and p_trace_parent on its outbox row, answering one row
(result, coupon, amount in yen, reason, expires_at) as that batch answers its one entry. The
answer RETRY, which that release does not know, becomes SQLSTATE 40001 serialization_failure,
which it retries: nothing of the call is written either way. Errors: 22023 when an id or
p_issued_at is NULL or p_cap_yen is NULL or not positive (its own check, as before 00014; the cap
is then ignored, R3's is coupon_rules'), otherwise issue_coupons_batch_v2's. SECURITY DEFINER,
executable by coupon_issue.$$;

COMMENT ON FUNCTION grant_coupon(uuid, text, text, timestamptz, integer, text) IS
$$The previous release's grant of one member (980de4a's couponctl grant calls it), kept as a thin
wrapper (docs/deploy.md, "Releases"): grant_coupons_batch for a batch of one, with issue_coupon's
arguments, answers and errors (RETRY as 40001). SECURITY DEFINER, executable by coupon_admin.$$;

COMMENT ON FUNCTION issue_dry_run_batch(text, text[]) IS
$$IssueCoupon's dry run ("dry_run": true, docs/api.md, "Dry run"), coalesced as issuances are (a
request alone is a group of one): what issue_coupons_batch_v2 would answer each member of
p_member_ids for campaign p_campaign_id now, at the database's clock, writing nothing and locking
no row. It answers one row per entry (i, its index from 1, a member given twice answered twice
alike): AVAILABLE (with the coupon's amount in yen and its expiry), or the refusal, in the
issuance's order: UNKNOWN_CAMPAIGN, ALREADY_ISSUED or COUPON_VOIDED (with the coupon and its
expiry), NOT_ELIGIBLE, CAMPAIGN_NOT_ACTIVE (with its reason), MONTHLY_CAP, BUDGET_EXCEEDED.
remaining_coupons, the coupons the stripes can still issue now by the budget and the releases, is
given on AVAILABLE and BUDGET_EXCEEDED, and next_release_at (release_next) on AVAILABLE,
BUDGET_EXCEEDED and NOT_STARTED. The campaign's reads (stripe 0, the releases, the stripes' room,
R3's cap) are made once per call, and each member costs its index lookups. Plain reads of the
committed state as of the call's snapshot: an issuance in flight may take the last coupon after it
answers. Errors: 22023 for a malformed campaign or member id, and for an array that is not 1 to
issuance_batch_max() members from index 1 without NULLs. Rules: as issue_coupons_batch_v2's,
and docs/design.md, "Releases, audiences and the dry run". STABLE, SECURITY DEFINER, executable
by coupon_issue alone.$$;

-- The issuance's helpers, executable by no role: the functions above call them as their owner.

COMMENT ON FUNCTION issuance_args_check(text, text, uuid[], text[], timestamptz[], text[]) IS
$$Refuses, with 22023 invalid_parameter_value naming the calling function p_fn, the arguments of an
issuance call that shared/issuance never sends: a campaign id or a member id outside its format
(shared/ids: 1 to 64 of A-Z a-z 0-9 _ -, and 1 to 128 bytes of visible ASCII 0x21-0x7E), no member
or more than issuance_batch_max(), arrays not one entry per member from index 1, a NULL id or
time, a coupon id given twice, a trace that is not a W3C traceparent of version 00 (a NULL trace is
none). An entry's faults are named in that order, the entries in theirs. It answers nothing when
the arguments are well formed. An array counted from 0 once let one member be charged to others
(00021). The shapes are judged by arg_array_fits in one expression, and arg_array_check names the
array at fault only when it fails (00023).$$;

COMMENT ON FUNCTION arg_array_fits(anyarray, integer, boolean) IS
$$Says whether array p_arr has the shape of an argument array: one dimension, counted from index 1,
exactly p_n elements (p_n not NULL), and no NULL element unless p_nulls_ok. False for a NULL or
empty array. It raises nothing: a SQL expression that the planner inlines into its caller, so a
well-formed call pays one expression (issuance_args_check, issue_dry_run_batch, campaign_create,
campaign_audience_change), and arg_array_check names a fault only when it answers false.$$;

COMMENT ON FUNCTION arg_array_check(text, text, anyarray, integer, boolean) IS
$$Refuses an argument array p_arr that arg_array_fits refuses, with 22023 invalid_parameter_value
naming the calling function p_fn and the argument p_name: its shape first (not one dimension
from index 1 with p_n elements, NULL or empty), then a NULL element unless p_nulls_ok, at its
index. It answers nothing for an array that fits.$$;

COMMENT ON FUNCTION issue_clock(text, timestamptz[]) IS
$$The issue time of every entry of a call: the database's clock (clock_timestamp()), read once and
answered once per element of p_issued_at, so that no caller chooses a coupon's period, its month
(R3) or its expiry. Errors: 22023 invalid_parameter_value, naming the calling function p_fn, for a
caller's time more than issue_clock_skew() from that clock: the previous release's times, taken a
moment earlier, pass (docs/api.md, "The rules and the row that serializes each"; 00021). VOLATILE:
each call reads the clock.$$;

COMMENT ON FUNCTION issue_clock_skew() IS
$$How far a caller's issue time may be from the database's clock: 5 seconds (issue_clock, and
outbox_claim_args_check for a claim's due time). The previous release takes its time once at a
call's start and keeps it through the call's retries and coalescing waits, all inside the app's
3 s timeout (docs/api.md, "The 3 s bound"); the 2 s more cover the clocks of Cloud Run and Cloud
SQL, both kept by Google's NTP (00021).$$;

COMMENT ON FUNCTION issuance_batch_max() IS
$$The most members one issuance call or dry-run call takes: 128, shared/issuance's MaxBatchMax, the
ceiling of ISSUE_BATCH_MAX (docs/api.md, "Configuration"). issuance_args_check and
issue_dry_run_batch refuse more with 22023.$$;

COMMENT ON FUNCTION monthly_cap_yen() IS
$$R3's monthly cap in force, in yen (coupon_rules.monthly_cap_yen, 1 to 1,000,000,000). It first
locks coupon_rules ACCESS SHARE, held to the caller's COMMIT, which coupon_rules_set waits for,
then reads the cap in a statement of its own, a new snapshot (VOLATILE, at READ COMMITTED): a call
that waited behind a rules change reads the cap that change committed (00024). The issuance calls
it first, before any row lock. Errors: 55P03 when the lock waits past the caller's lock_timeout.
It names its table by its schema, which no temporary table can stand in for, instead of setting a
search_path. Rules: R3, docs/api.md, "The monthly cap".$$;

COMMENT ON FUNCTION campaign_inactive_reason(timestamptz, timestamptz, timestamptz, timestamptz, timestamptz) IS
$$Why a campaign whose budget stripe holds starts_at p_starts, ends_at p_ends, paused_at p_paused
and coupons_expire_at p_expire issues no coupon at instant p_at: ENDED at or after p_ends or
p_expire, else PAUSED when p_paused is set, else NOT_STARTED before p_starts, or NULL when it is
active (a NULL bound is open). The reasons of CAMPAIGN_NOT_ACTIVE (docs/api.md), in this order.
The issuance judges it in its reads and again on each stripe it writes, at the database's clock
(docs/design.md, "Changing a live campaign", and "Voids, expiry and grants" for the expiry, 00015).
IMMUTABLE SQL, inlined into its caller, raises nothing.$$;

COMMENT ON FUNCTION coupon_expiry(timestamptz, integer, timestamptz) IS
$$When a coupon issued at p_at expires: p_until when set (a campaign's fixed coupons_expire_at),
else the start of the Asia/Tokyo day p_days days after the issue day (the issue day is the first:
p_days 1 expires at the midnight after it), or NULL when both are NULL (no validity). The
first instant the coupon is no longer valid (docs/api.md, expires_at; docs/design.md, "Voids,
expiry and grants"). IMMUTABLE SQL, raises nothing.$$;

COMMENT ON FUNCTION release_next(text, timestamptz, timestamptz, timestamptz, timestamptz) IS
$$The first instant after p_now at which campaign p_campaign_id's releases (campaign_releases) open
more coupons: a release opens at its instant, or at the campaign's start p_starts if that is
later, and never at or after its end p_ends or its coupons' fixed expiry p_until. NULL when none
is to come. The next_release_at of the issuance and the dry run, and of couponctl's campaign show,
list and grant and the console's pages (00027, docs/api.md, "Releases and audiences"). Raises
nothing. Executable by coupon_admin and coupon_console.$$;

COMMENT ON FUNCTION release_share(bigint, integer, bigint) IS
$$How many of p_released coupons stripe p_stripe (from 0) of p_stripes may hold: an even split in
whole coupons, the first stripes one more, as campaign_change_budget lays out a budget. Each
stripe's share only grows with p_released, and the shares sum to p_released exactly. 22012
division_by_zero for p_stripes 0 (a campaign has at least one stripe). docs/design.md, "Releases,
audiences and the dry run".$$;

COMMENT ON FUNCTION release_room(text, integer, bigint, timestamptz) IS
$$How many more coupons stripe p_stripe of campaign p_campaign_id, holding p_held coupons, may take
by the release schedule at p_at: its release_share of the coupons released by p_at, over the
campaign's stripes as they are now, less p_held (0 or below: none). VOLATILE, so that each call
reads the releases and the stripes afresh: called in the WHERE of the statement that locks a
stripe, it is judged again on the row it waited for (EvalPlanQual), after a re-stripe that
changed the count. The issuance calls it only for a campaign with releases. docs/design.md,
"Releases, audiences and the dry run".$$;

-- The relay.

COMMENT ON FUNCTION outbox_claim(integer, uuid, interval, timestamptz, interval) IS
$$RelayOutbox's claim (shared/outbox/outboxdb.Claim): takes up to p_limit open outbox rows due at
p_due_at for run p_run, oldest due first, skipping rows another transaction holds (FOR UPDATE SKIP
LOCKED, in a CTE evaluated once, so a claim never takes more than p_limit rows and never waits).
Each row taken is either closed as skipped, never to be pushed, with its skip_reason: voided (its
coupon was voided), expired (its coupon expires before the lease ends, so a push under the lease
could reach the member after the expiry) or no_line_account (its member has no LINE account
linked), or leased to the run for p_lease (next_attempt_at moved past it, claimed_by set), with
first_pushed_at set if unset before its push goes out, so that a crash between push and mark
cannot lose the start of LINE's retry-key window. It answers every row it took: the coupon, its
member, attempts, campaign, amount in yen, LINE user id, key_expired (a leased row first pushed
more than p_key_window ago), the row's previous next_attempt_at and first_pushed_at, its trace,
the coupon's expiry, and skip_reason (NULL for a leased row). The database decides what may be
pushed: a reason added by a migration binds every relay that calls it, and outbox_lease_refused
binds the previous release's inline claim. Errors: 22023 for arguments shared/outbox never sends
(outbox_claim_args_check, judged before any row is read). docs/design.md, "The transactional
outbox". SECURITY DEFINER, executable by coupon_relay.$$;

COMMENT ON FUNCTION outbox_claim_args_check(integer, uuid, interval, timestamptz, interval) IS
$$Refuses, with 22023 invalid_parameter_value, outbox_claim's arguments that shared/outbox never
sends: a limit p_limit outside 1 to 1000 rows (RELAY_BATCH_SIZE's range), no run p_run, a lease
p_lease or a retry-key window p_key_window not above 0 and at most 23 hours (inside LINE's 24),
a due time p_due_at missing or after the database's clock plus issue_clock_skew(): a caller's
clock would claim rows before they are due. It answers true, so that the claim's UPDATE gates on it
in its WHERE, a one-time filter evaluated before any row is read (00021).$$;

COMMENT ON FUNCTION outbox_lease_refused() IS
$$The BEFORE UPDATE OF claimed_by trigger function of notification_outbox (trigger
outbox_lease_refused, fired when an update sets claimed_by to a run): it answers NULL, so that
PostgreSQL neither changes the row nor returns it from the statement's RETURNING, when the row's
coupon is voided or expires by the lease's end (NEW.next_attempt_at), outbox_claim's own rule,
and NEW otherwise. No relay of any release takes a lease on a coupon that may not be pushed: the
previous release claims with its own UPDATE, which knows voids but not expiry (00022). The refused
row stays open and unleased, and outbox_claim closes it as skipped on its next run. It takes no
lock: it reads the coupon row by its key in a snapshot of its own, taken after the claim locked
the outbox row, so it sees a void that committed meanwhile (a void still open holds the outbox
row, which every claim skips). It runs with the rights of the statement that fires it and names
its table by its schema. Raises nothing. docs/design.md, "The database decides what is
pushed".$$;

COMMENT ON FUNCTION outbox_push_state(timestamptz, notification_outbox) IS
$$What became of a coupon's LINE push, from its outbox row o (all NULL when it has none) and when
couponctl outbox prune deleted that row (p_pruned): pruned, no outbox row, sent, skipped, parked,
in flight (a relay run holds it and its lease runs), or not sent. coupon_void answers it. Raises
nothing.$$;

-- The operators' functions (couponctl, coupon_admin), each writing its history.

COMMENT ON FUNCTION campaign_lock(text) IS
$$The lock protocol of every change of a campaign: stripe 0 of campaign p_campaign_id FOR UPDATE
first (the changes of one campaign queue there), then, in a new statement that sees every stripe
committed meanwhile, all its stripes FOR UPDATE in stripe order. It answers the stripes, newest
committed, in stripe order. Errors: CI404 for a campaign that does not exist, 55P03 when a lock
waits past the transaction's lock_timeout (couponctl's campaign.ChangeLockTimeout, 1 s, or the
console's operator_lock_timeout). Why it never waits in a cycle with an issuance: docs/design.md,
"Lock order". Called by the change functions as their owner.$$;

COMMENT ON FUNCTION campaign_change_record(text, timestamptz, text, jsonb, jsonb, text) IS
$$Appends one row to campaign_changes, campaign p_campaign_id's history, and answers it: what
changed (p_what), the settings before and after (p_before, p_after), why (p_reason), at p_at
(taken once the change holds the campaign's stripes, so change_id and changed_at follow commit
order), by the database login (session_user). Errors: CI422 for a missing or blank reason.
Called by the change functions as their owner (docs/design.md, "Changing a live campaign").$$;

COMMENT ON FUNCTION campaign_change_state(text, text, timestamptz, timestamptz, boolean, boolean, text) IS
$$Pauses (p_what 'pause'), resumes ('resume') or ends now ('end') campaign p_campaign_id, or moves
its period ('period': to p_starts and p_ends, each kept when p_set_starts or p_set_ends is false,
NULL an open bound), for reason p_reason. Once it commits, no coupon of the campaign commits while
its stripes show it inactive: the issuance judges the stripe it writes, and this change holds every
stripe (campaign_lock) until it commits. 'end' makes the change's time the campaign's ends_at. It
answers the campaign_changes row, or none when the campaign already was in that state. Errors:
CI404 for no such campaign, CI422 for ending a campaign that has not started (pause it, or move
its period), a start not before the end, or a blank reason, 22023 for another p_what, 55P03 as
campaign_lock. docs/design.md, "Changing a live campaign". SECURITY DEFINER, executable by
coupon_admin (couponctl campaign pause, resume, end, update).$$;

COMMENT ON FUNCTION campaign_change_budget(text, bigint, bigint, integer, text) IS
$$Lays campaign p_campaign_id's budget out anew: p_budget_yen in yen (NULL keeps it), or the budget
in force plus p_add_yen (negative cuts), over p_stripes budget stripes (NULL keeps their number,
1 to 64), for reason p_reason. Both the budget and the issued yen are spread over the stripes in
whole coupons, as evenly as possible (yen no coupon can use stay on stripe 0), so every stripe
keeps issued_yen <= budget_yen, the stripes sum to exactly the new budget, and the issued yen,
summed, stay what they were. A stripe it adds gets stripe 0's definition. It answers one
campaign_changes row per thing changed ('budget', 'stripes'), none when nothing changed. Errors:
CI404 for no such campaign, CI422, changing nothing, for a budget and an add together, a budget
below the yen already issued, below one coupon or above 2,147,483,647 yen, a number of stripes
outside 1 to 64 or above the budget's coupons, or a blank reason, 55P03 as campaign_lock. R1, and
docs/design.md, "Changing a live campaign". SECURITY DEFINER, executable by coupon_admin
(couponctl campaign update).$$;

COMMENT ON FUNCTION campaign_change_validity(text, integer, timestamptz, text) IS
$$Sets the validity campaign p_campaign_id gives the coupons issued from now on: p_valid_days
Asia/Tokyo days (1 to 3650), or until p_expire_at, or none (both NULL), for reason p_reason.
Coupons already issued keep theirs. It takes the change protocol (campaign_lock) and answers the
campaign_changes row, or none when the validity is unchanged. Errors: CI404 for no such
campaign, CI422 for both at once, days out of range, an instant that has passed (coupons would be
issued expired) or a blank reason, 55P03 as campaign_lock. docs/design.md, "Voids, expiry and
grants". SECURITY DEFINER, executable by coupon_admin (couponctl campaign update).$$;

COMMENT ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text) IS
$$Creates campaign p_campaign_id, open to every member and without releases: p_discount_yen yen a
coupon, p_budget_yen yen of budget over p_stripes budget stripes (1 to 64, each an equal share of
whole coupons, the first stripes one more, the yen that make no whole coupon on stripe 0), active
from p_starts to p_ends (NULL: unbounded), its coupons valid p_valid_days Asia/Tokyo days (1 to
3650) or until p_expire_at (or no validity), for reason p_reason. It answers the 'create'
campaign_changes row. Errors: CI422 for a malformed id, a discount not positive, a budget below one
coupon, stripes out of range or above the budget's coupons, days out of range, both validities, a
start not before the end, or a blank reason (internal/ops/campaign's Validate refuses the same),
CI409 (message 'exists') for a campaign id that exists. It waits only for a concurrent create of
the same id. R1; docs/design.md, "Lock order". SECURITY DEFINER, executable by coupon_admin
(couponctl campaign create; the 12-argument form calls it).$$;

COMMENT ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text, timestamptz[], integer[], boolean) IS
$$Creates a campaign as the 9-argument campaign_create does, then gives it releases and an
audience: p_release_coupons[k] coupons released at p_release_at[k] (both NULL or empty: no
schedule, the whole budget from the start; coupons not taken roll over, and budget_yen still caps
everything), and p_audience_only (true: only the members of campaign_audience may be issued it).
Both are set once, here, and never changed, so a read of them (on stripe 0) needs no lock. Its
'create' history row names the releases and the audience. Errors: the 9-argument form's, and
CI422 for release arrays of unequal length, with NULLs or not one dimension from index 1, a NULL
p_audience_only, a release of fewer than 1 coupon, at or after the campaign's end, two releases
at one instant, or releases summing above the budget's coupons (budget_yen / discount_yen).
docs/design.md, "Releases, audiences and the dry run". SECURITY DEFINER, executable by
coupon_admin (couponctl campaign create with its release and audience flags).$$;

COMMENT ON FUNCTION campaign_release_add(text, timestamptz, integer, text) IS
$$Releases p_coupons more coupons of campaign p_campaign_id at instant p_at, for reason p_reason,
and answers the 'release' campaign_changes row. It locks stripe 0 (FOR UPDATE), as every change of
a campaign does, so that two adds, or an add and a budget change, read each other's result, and
issuances do not wait for it, since an instant in the future binds no issuance in flight. Errors:
CI404 for an unknown campaign, CI422 for a campaign created without releases (it issues its whole
budget from its start), an instant not after the database's clock, at or after the campaign's end,
or already used, a count below 1, releases summing above the budget's coupons, or a blank reason,
55P03 when stripe 0 waits past the lock_timeout. docs/design.md, "Lock order" and "Releases,
audiences and the dry run". SECURITY DEFINER, executable by coupon_admin (couponctl campaign
update --release).$$;

COMMENT ON FUNCTION campaign_audience_change(text, text[], boolean, text) IS
$$Adds (p_add true) or removes (false) the members p_member_ids (1 to 1000 member ids a call) to
or from the audience of audience-only campaign p_campaign_id, for reason p_reason, and answers how
many it actually added or removed: a member already present, or already absent, changes nothing,
so a call sent again is harmless. One 'audience' history row per call names the counts. It locks
only the audience rows it changes, in member order: an issuance holds its member's row FOR KEY
SHARE from its reads to its COMMIT, so a removal waits for those members' issuances in flight, and
once it returns none of them commits a coupon. Errors: CI404 for an unknown campaign, CI422 for a
campaign open to every member, a missing direction, an array not 1 to 1000 ids from index 1
without NULLs, a malformed id or a blank reason, 55P03 past the lock_timeout (couponctl sends the
chunk again). docs/design.md, "Lock order" and "Releases, audiences and the dry run". SECURITY
DEFINER, executable by coupon_admin (couponctl campaign audience add and remove).$$;

COMMENT ON FUNCTION counters_repair(text) IS
$$couponctl reconcile --repair: rebuilds every drifted counter from the live coupons, for reason
p_reason, in the issuance's lock order: each drifted member x month row first, in (member, month)
order (locked, created if missing, then counted by a new statement, so a coupon committed while
it waited is counted), then each drifted campaign's stripes by the change protocol
(campaign_lock), its live total laid over them in stripe order, each up to its own budget. A
campaign whose live coupons exceed its budget is left alone and named. It answers one row per
counter: kind 'usage' (key member and month) or 'campaign' (key its id), with the yen before and
after, or 'refused' (before_yen its budget, after_yen its live coupons' yen). Each campaign
changed gets a 'repair' history row. Errors: CI422 for a blank reason, 55P03 when a lock waits
past the lock_timeout (internal/ops/reconcile sets 2 s a lock): nothing written. R1 and R3, and
docs/design.md, "Lock order". SECURITY DEFINER, executable by coupon_admin.$$;

COMMENT ON FUNCTION coupon_void(uuid, text, boolean) IS
$$Voids coupon p_coupon_id for reason p_reason, by the database login (session_user), and gives
its yen back exactly once, to its member's month (R3) and to one budget stripe of its campaign
holding at least them (R1); with p_allow_reissue the coupon releases its (campaign, member) pair
(R2), so the member may be issued the campaign again. Lock order: the coupon row (FOR UPDATE: two
voids of one coupon queue there, and the second finds it voided), its month row, its outbox row
while it is open, which it closes as skipped (reason voided) unless a relay run holds it, so no
claim of any release pushes it after, then one stripe (one nobody holds first). It answers result
VOIDED, or, changing nothing, ALREADY_VOIDED or REDEEMED (a legacy coupon tied to an order), with
the coupon's campaign, member, month, amount in yen, when and by whom it was voided, and push,
what became of its LINE push (outbox_push_state: sent with pushed_at, in flight, not sent and now
never to be, skipped, parked, pruned, no outbox row). Errors: CI404 for a coupon that does
not exist, CI422 for a blank reason, XX000 internal_error when a counter holds less than the
coupon (run couponctl reconcile), 55P03 past the session's lock_timeout. docs/design.md, "Voids,
expiry and grants" and "Lock order". SECURITY DEFINER, executable by coupon_admin (couponctl
coupon void; console_void calls it).$$;

COMMENT ON FUNCTION coupon_allow_reissue(uuid, text) IS
$$Lets the member of coupon p_coupon_id, voided without reissue, be issued its campaign again, for
reason p_reason: the coupon leaves R2's index (reissue_allowed), so IssueCoupon and grant issue
the pair anew under R1 to R3, and the coupon's history (coupon_changes, 'allow_reissue') records
it. No counter changes: the coupon's yen went back at the void. It locks the coupon row alone, the
void's first lock. It answers result RELEASED (with the history row's time and login),
ALREADY_ALLOWED or NOT_VOIDED (a live or redeemed coupon: void it with --allow-reissue), the last
two changing nothing, with the coupon's campaign, member, and its void's time and login. Errors:
CI404 for no such coupon, CI422 for a blank reason. docs/design.md, "Voids, expiry and grants".
SECURITY DEFINER, executable by coupon_admin (couponctl coupon void --allow-reissue on a voided
coupon).$$;

COMMENT ON FUNCTION coupon_rules_set(integer, bigint, text) IS
$$Sets the rule settings for reason p_reason: R3's monthly cap p_monthly_cap_yen (1 to
1,000,000,000 yen, so that a member's used yen plus a coupon fits an integer) and the console's
approval line p_approval_above_yen (0 to 2,147,483,647 yen: a raise above it needs a second
approver). NULL keeps a setting, and at least one is given. It writes one coupon_rules_changes row
holding the settings changed and answers it, or nothing when both already are as given. A cap
change locks coupon_rules ACCESS EXCLUSIVE, so the change's time divides the coupons exactly: it
waits until every issuance that read the old cap has ended (each holds ACCESS SHARE from its read,
monthly_cap_yen, its first lock, to its COMMIT), and the issuances after it read the new cap, then
take their clock, so each coupon's issued_at falls in the span of the cap it was issued under, as
reconcile judges R3. Issuances queue behind it while it waits. A change of the line alone locks
only the row, so issuances never wait for it. Errors: CI422 for neither setting, one out of range,
or a blank reason, 55P03 after its own lock_timeout of 1 s, nothing changed. R3; docs/api.md, "The
monthly cap". SECURITY DEFINER, executable by coupon_admin (couponctl rules set).$$;

COMMENT ON FUNCTION console_role_set(text, text, text) IS
$$Gives the person with email p_email (normalized by operator_email) the console role p_role
(viewer, operator or approver), for reason p_reason, and answers the console_role_changes row,
or nothing when the email has that role already. Role changes queue on console_roles' SHARE ROW
EXCLUSIVE lock, so two grants of a new email cannot both insert it, and readers (console_role_of)
do not wait for it. Errors: CI422 for a malformed email, an unknown role or a blank reason, 55P03
after its own lock_timeout of 1 s. docs/roles.md, "The console". SECURITY DEFINER, executable by
coupon_admin (couponctl console grant).$$;

-- The console's functions (coupon_console): each takes the person's email, checks the person's
-- role and calls the change functions the CLI calls, so the rules, locks and history are theirs.

COMMENT ON FUNCTION console_role_of(text) IS
$$The console role of the person with email p_email: viewer, operator or approver, viewer for an
email console_roles does not hold. Errors: CI422 for a malformed email (operator_email). PL/pgSQL,
so that each session plans its statement once. docs/roles.md, "The console". STABLE, SECURITY
DEFINER, executable by coupon_console (the console's pages) and called by operator_require.$$;

COMMENT ON FUNCTION console_pause(text, boolean, text, text) IS
$$Pauses (p_pause true) or resumes (false) campaign p_campaign_id for the person p_operator (an
operator or approver), for reason p_reason, through campaign_change_state, and answers the
campaign_changes row, naming the person (operator_email): none when the campaign already was so.
Errors: 42501 for a viewer, CI422 for a malformed email or a NULL p_pause, otherwise
campaign_change_state's (CI404, CI422), and 55P03 after operator_lock_timeout's 1 s. It locks as
the CLI's change does (docs/design.md, "Lock order"). SECURITY DEFINER, executable by
coupon_console.$$;

COMMENT ON FUNCTION console_end(text, text, text) IS
$$Ends campaign p_campaign_id now for the person p_operator (an operator or approver), for reason
p_reason, through campaign_change_state, answering and refusing as console_pause does. SECURITY
DEFINER, executable by coupon_console.$$;

COMMENT ON FUNCTION console_budget(text, bigint, bigint, integer, text, text) IS
$$Changes campaign p_campaign_id's budget (p_budget_yen yen, or p_add_yen yen added, negative
cuts) and stripes (p_stripes), as campaign_change_budget takes them, for the person p_operator (an
operator or approver) and reason p_reason. A raise of more than coupon_rules.approval_above_yen
over the budget in force becomes a request instead (applied false, its request_id), which
console_decide applies once a different approver approves it. Otherwise the change is applied
(applied true, request_id NULL) and its history rows name the person. It reads the line
(coupon_rules, ACCESS SHARE) before it locks the stripes, as an issuance reads the cap, then
judges the raise on the budget it holds. Errors: 42501 for a viewer, CI422 for a malformed email,
nothing to change, a budget and an add together or a blank reason, otherwise
campaign_change_budget's, and 55P03 after operator_lock_timeout's 1 s. R1; docs/roles.md, "The
console"; docs/design.md, "Lock order". SECURITY DEFINER, executable by coupon_console.$$;

COMMENT ON FUNCTION console_period(text, timestamptz, timestamptz, text, text) IS
$$Asks to move campaign p_campaign_id's period to start at p_starts and end at p_ends (NULL keeps
that bound), for the person p_operator (an operator or approver) and reason p_reason: always a
request (applied false, its request_id), applied by console_decide through campaign_change_state
once a different approver approves it. Errors: 42501 for a viewer, CI404 for no such campaign,
CI422 for a malformed email, no bound given, a start not before the end or a blank reason.
docs/roles.md, "The console". SECURITY DEFINER, executable by coupon_console.$$;

COMMENT ON FUNCTION console_decide(bigint, boolean, text, text) IS
$$Approves (p_approve true) or rejects (false) request p_request_id for the person p_operator, who
must be an approver other than its requester, for reason p_reason, and answers the request as
decided (campaign_change_requests). An approval applies the request through
campaign_change_budget or campaign_change_state in the same transaction, and the history rows it
writes name the approver and the request. Two decisions of one request queue on its row (FOR
UPDATE) and the second finds it decided: a request is applied at most once. Errors: 42501 for a
person who is not an approver or who made the request, CI404 for no such request, CI409 for a
request decided already or lapsed (change_request_lifetime, by the database's clock as it
decides), CI422 for a malformed email, a NULL p_approve or a blank reason, otherwise the change
function's refusals, and the request stays as it was, 55P03 after operator_lock_timeout's 1 s.
docs/roles.md, "The console". SECURITY DEFINER, executable by coupon_console.$$;

COMMENT ON FUNCTION console_void(uuid, boolean, text, text) IS
$$Voids coupon p_coupon_id (allowing its reissue when p_allow_reissue) for the person p_operator
(an operator or approver), for reason p_reason, through coupon_void, and answers as coupon_void
does (VOIDED, ALREADY_VOIDED, REDEEMED and its columns), with the voiding person's email beside
voided_by (issued_coupons.voided_by_email). Errors: 42501 for a viewer, CI422 for a malformed
email, otherwise coupon_void's (CI404, CI422, XX000), and 55P03 after operator_lock_timeout's 1 s.
docs/design.md, "Voids, expiry and grants". SECURITY DEFINER, executable by coupon_console.$$;

COMMENT ON FUNCTION change_request_lifetime() IS
$$How long a console request waits for its approver: 24 hours from requested_at, by the
database's clock. Then it has lapsed and cannot be decided (console_decide, CI409), and the view
campaign_change_requests says so as it is read: no scheduler marks a request lapsed.
docs/roles.md, "The console".$$;

-- The console's helpers, executable by no role: the console_* functions call them as their owner.

COMMENT ON FUNCTION operator_email(text) IS
$$Email p_email as the console's tables keep it: trimmed, in lower case. Errors: CI422 for one
that is not an address: 1 to 64 characters of RFC 5322's dot-atom before the @, a domain of
dot-separated labels of letters, digits and inner hyphens after it, 254 characters at most.$$;

COMMENT ON FUNCTION operator_require(text, text, text) IS
$$Answers email p_email normalized (operator_email) when the person's console role
(console_role_of) is at least p_need (viewer, operator or approver, in that order), and refuses
the person otherwise with 42501 insufficient_privilege, naming p_act, what was asked: nothing
changed. CI422 for a malformed email. The console_* functions call it first.$$;

COMMENT ON FUNCTION operator_lock_timeout() IS
$$Sets the transaction's lock_timeout to 1 s unless the session set one of its own (as couponctl's
changes do, campaign.ChangeLockTimeout): a console change waits for a budget stripe at most as
long as an issuance does, then gives up with 55P03, nothing changed. docs/design.md, "Lock
order".$$;

COMMENT ON FUNCTION operator_changes_mark(bigint[], text, bigint) IS
$$Names the person p_email (and the request p_request_id, or NULL) on the campaign_changes rows
p_change_ids, which a change function wrote in this transaction, and answers them
(campaign_changes.operator_email and request_id, beside changed_by, the database login). Raises
nothing.$$;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
