-- +goose Up
-- The W3C traceparent of the IssueCoupon request that wrote the row (shared/issuance), so that
-- the relay's LINE push span links back to the issuing trace in Cloud Trace (shared/outbox).
-- NULL for rows written without a trace. It carries trace and span ids only, never a member id.
ALTER TABLE notification_outbox ADD COLUMN trace_parent text;

-- +goose Down
ALTER TABLE notification_outbox DROP COLUMN trace_parent;
