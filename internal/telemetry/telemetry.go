// Package telemetry is agentjail's optional OpenTelemetry export
// (serve --otlp-endpoint): traces of API calls — a request's span, the
// jail manager's operation below it, the backend's steps and the calls
// into the jail's init below that — and the jails' events as OTLP logs,
// each jail's under a resource naming it (agentjail.jail.id, .name,
// .tenant, .level), both sent over OTLP/HTTP (protobuf).
//
// Without an endpoint nothing is set up: the global tracer provider stays
// OpenTelemetry's no-op one, so the spans cost next to nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/propagation"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/tracing"
)

// Exporter is the OTLP export set up by Setup.
type Exporter struct {
	traces *sdktrace.TracerProvider
	logs   sdklog.Exporter
	base   *resource.Resource
}

// Setup exports traces and jail events to the OTLP/HTTP endpoint (a URL
// such as http://collector:4318, or host:port for plain HTTP) and installs
// the tracer provider and the W3C trace-context propagator globally.
func Setup(ctx context.Context, endpoint, version string) (*Exporter, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("--otlp-endpoint: %q is not an http(s) URL or host:port", endpoint)
	}
	base := strings.TrimSuffix(u.String(), "/")
	te, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(base+"/v1/traces"), otlptracehttp.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("otlp traces: %w", err)
	}
	le, err := otlploghttp.New(ctx, otlploghttp.WithEndpointURL(base+"/v1/logs"), otlploghttp.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("otlp logs: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName("agentjail"), semconv.ServiceVersion(version))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(te, sdktrace.WithBatchTimeout(time.Second)), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &Exporter{traces: tp, logs: le, base: res}, nil
}

// Shutdown flushes what is pending and stops the export.
func (e *Exporter) Shutdown(ctx context.Context) error {
	if e == nil {
		return nil
	}
	return errors.Join(e.traces.Shutdown(ctx), e.logs.Shutdown(ctx))
}

// maxQueuedEvents bounds the events of one jail waiting for export; more
// are dropped (the JSONL files keep every one).
const maxQueuedEvents = 8192

// JailEvents starts the export of jail j's events as logs, under a
// resource naming the jail. It returns the function that exports one
// event (safe to call on the event path: it never blocks) and the one
// that flushes and ends the export. Syscall events are not exported (they
// are counted in the report and kept in the JSONL files): at up to a
// million a second they would swamp a collector.
func (e *Exporter) JailEvents(j model.Jail) (emit func(*observe.Event), stop func()) {
	res, err := resource.Merge(e.base, resource.NewSchemaless(
		tracing.JailID.String(j.ID), tracing.JailName.String(j.Name), tracing.JailTenant.String(j.Tenant), tracing.JailLevel.String(j.Config.Isolation.Level)))
	if err != nil {
		res = e.base
	}
	lp := sdklog.NewLoggerProvider(sdklog.WithResource(res),
		sdklog.WithProcessor(sdklog.NewBatchProcessor(shared{e.logs}, sdklog.WithMaxQueueSize(maxQueuedEvents), sdklog.WithExportInterval(time.Second))))
	logger := lp.Logger("github.com/agentjail/agentjail/events")
	var once sync.Once
	emit = func(ev *observe.Event) {
		if ev.Type == observe.TypeSyscall {
			return
		}
		var r otellog.Record
		r.SetTimestamp(time.Unix(0, ev.TS))
		r.SetObservedTimestamp(time.Now())
		r.SetSeverity(otellog.SeverityInfo)
		r.SetEventName("agentjail." + ev.Type.String())
		r.SetBody(attribute.StringValue(string(ev.AppendJSON(nil))))
		r.AddAttributes(attribute.String("event.type", ev.Type.String()), attribute.Int("pid", int(ev.PID)))
		logger.Emit(context.Background(), r)
	}
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = lp.Shutdown(ctx)
		})
	}
	return emit, stop
}

// shared is the log exporter as one jail's provider sees it: shutting
// the provider down flushes it but leaves it to the other jails.
type shared struct{ sdklog.Exporter }

func (shared) Shutdown(context.Context) error { return nil }
