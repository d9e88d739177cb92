//! Log lines that carry the trace ids of the span they were written in.

use std::fmt;

use opentelemetry::Context;
use opentelemetry::trace::TraceContextExt;
use tracing::Subscriber;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON log line with the active span's `trace_id` and `span_id` at
/// the top level, so a log line and its trace join.
#[derive(Debug)]
pub(crate) struct WithTraceIds<F>(pub(crate) F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    N: for<'writer> FormatFields<'writer> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        // Entering a span makes its OpenTelemetry context current.
        let context = Context::current();
        let ids = context.span().span_context().clone();
        if !ids.is_valid() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.trim_end().strip_suffix('}') {
            Some(open) => writeln!(
                writer,
                "{open},\"trace_id\":\"{}\",\"span_id\":\"{}\"}}",
                ids.trace_id(),
                ids.span_id()
            ),
            None => writer.write_str(&line),
        }
    }
}
