// Package gcpfake holds local stand-ins for the two Google Cloud endpoints that a deployed
// function's telemetry talks to: the instance metadata server ([Metadata]: project, region,
// instance id and the service account's access token) and Google's Telemetry (OTLP) API
// ([TelemetryAPI]: where spans and metrics are written).
//
// Tests point the production code at them through the variables Google's client libraries and
// the OTLP exporters read themselves (GCE_METADATA_HOST; OTEL_EXPORTER_OTLP_ENDPOINT with
// OTEL_EXPORTER_OTLP_CERTIFICATE), so that what they exercise is the deployed path with only
// Google's hosts swapped. They check what the Telemetry API documents and nothing it does not:
// see [TelemetryAPI] for the rules.
package gcpfake
