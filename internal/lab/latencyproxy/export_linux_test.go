package latencyproxy

// MaxWakeLate is how early, at most, a chunk may leave: sleepUntil arms its timer the learned
// wake-up lateness before the deadline, bounded by maxWakeLate.
const MaxWakeLate = maxWakeLate
