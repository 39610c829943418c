// Package tracing makes agentjail's OpenTelemetry spans: one tracer for
// the whole daemon, and the attribute keys that name a jail. It depends
// on the OpenTelemetry API alone; where the spans go (nowhere, or an OTLP
// collector) is internal/telemetry's business.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of agentjail's spans and resources.
const (
	JailID     = attribute.Key("agentjail.jail.id")
	JailName   = attribute.Key("agentjail.jail.name")
	JailTenant = attribute.Key("agentjail.tenant")
	JailLevel  = attribute.Key("agentjail.level")
)

// Tracer is the tracer of every span agentjail makes.
func Tracer() trace.Tracer { return otel.Tracer("github.com/agentjail/agentjail") }

// Start starts a span named name under ctx's, with attrs.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return Tracer().Start(ctx, name, trace.WithAttributes(attrs...))
}

// End ends span, recording err (if any) as its status.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
