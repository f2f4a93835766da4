//! `weir jobs list|describe|watch|cancel|drain|logs`: a small Job API client for a running server.
//!
//! Job times and logs come from the standard streams (GetStateStream,
//! GetMessageStream); the client sends the metadata
//! `weir-follow: false` ([`weir_jobs::service::FOLLOW_HEADER`]) to get a
//! job's history without following it, and leaves it out for `logs --follow`.
//! Another Beam job server ignores the header and follows the job instead.
//! `logs` also sends `weir-logs: all` ([`weir_jobs::service::LOGS_HEADER`])
//! to get every SDK log entry, not only the warnings and errors that the
//! message stream carries.

use std::collections::BTreeMap;

/// `println!` for a command-line tool: when its reader has gone (`weir jobs
/// list | head`) the command ends quietly with status 0 instead of
/// panicking on the broken pipe (SIGPIPE stays ignored, so a socket the
/// server closes cannot kill the process).
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

use anyhow::Context;
use futures::StreamExt;
use tonic::transport::Channel;
use weir_jobs::resources;
use weir_proto::beam;
use weir_proto::beam::job_message::MessageImportance;
use weir_proto::beam::job_messages_response::Response as Event;
use weir_proto::beam::job_service_client::JobServiceClient;
use weir_proto::prost_types::{value::Kind, Struct, Timestamp, Value};

use crate::{JobsAction, JobsArgs};

/// Adds the Job API token (`--auth_token`, `--auth_token_file` or
/// `$WEIR_AUTH_TOKEN`) to every call, as `authorization: Bearer TOKEN`.
#[derive(Clone)]
struct AddToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for AddToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request
                .metadata_mut()
                .insert(weir_jobs::security::TOKEN_HEADER, v.clone());
        }
        Ok(request)
    }
}

type Client = JobServiceClient<tonic::service::interceptor::InterceptedService<Channel, AddToken>>;

/// The token `weir jobs` sends, if any.
fn token(args: &JobsArgs) -> anyhow::Result<Option<String>> {
    let token = match (&args.auth_token, &args.auth_token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read --auth_token_file {}", f.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        ),
        (None, None) => std::env::var("WEIR_AUTH_TOKEN").ok(),
    };
    Ok(token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
}

fn state_name(state: i32) -> &'static str {
    beam::job_state::Enum::try_from(state)
        .map(|s| s.as_str_name())
        .unwrap_or("UNKNOWN")
}

fn show(v: &Value) -> String {
    match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        Some(Kind::NumberValue(n)) => n.to_string(),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::ListValue(l)) => format!(
            "[{}]",
            l.values.iter().map(show).collect::<Vec<_>>().join(", ")
        ),
        Some(Kind::StructValue(s)) => {
            format!(
                "{{{}}}",
                s.fields
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", show(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Some(Kind::NullValue(_)) | None => "null".into(),
    }
}

/// A request that asks for the job's history only (see the module doc).
fn history_only<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        weir_jobs::service::FOLLOW_HEADER,
        tonic::metadata::MetadataValue::from_static("false"),
    );
    r
}

/// RFC 3339 UTC to the millisecond: `2025-01-31T12:00:00.123Z`.
fn when(t: &Timestamp) -> String {
    let text = t.to_string();
    match text.split_once('.') {
        Some((secs, frac)) => {
            let digits: String = frac.chars().filter(char::is_ascii_digit).take(3).collect();
            format!("{secs}.{digits:0<3}Z")
        }
        None => text,
    }
}

/// Shortens a JobMessage time (RFC 3339 from Weir; other servers may send anything).
fn when_text(t: &str) -> String {
    match t.split_once('.') {
        Some((secs, frac)) if t.ends_with('Z') => {
            let digits: String = frac.chars().filter(char::is_ascii_digit).take(3).collect();
            format!("{secs}.{digits:0<3}Z")
        }
        _ => t.to_string(),
    }
}

/// The job's state changes so far: (time, state).
async fn states(
    client: &mut Client,
    job_id: &str,
) -> anyhow::Result<Vec<(Option<Timestamp>, i32)>> {
    let mut stream = client
        .get_state_stream(history_only(beam::GetJobStateRequest {
            job_id: job_id.to_string(),
        }))
        .await?
        .into_inner();
    let mut out = vec![];
    while let Some(event) = stream.next().await {
        let event = event?;
        out.push((event.timestamp, event.state));
    }
    Ok(out)
}

fn is_terminal(state: i32) -> bool {
    beam::job_state::Enum::try_from(state)
        .map(weir_jobs::registry::is_terminal)
        .unwrap_or(false)
}

/// Start (STARTING, else RUNNING) and end (a terminal state) times.
fn start_end(states: &[(Option<Timestamp>, i32)]) -> (String, String) {
    let find = |f: &dyn Fn(i32) -> bool| {
        states
            .iter()
            .find(|(_, s)| f(*s))
            .and_then(|(t, _)| t.as_ref())
            .map(when)
            .unwrap_or_else(|| "-".into())
    };
    (find(&has_started), find(&is_terminal))
}

/// Whether a job in `state` has started (STARTING or RUNNING): the state
/// event that gives its start time.
fn has_started(state: i32) -> bool {
    use beam::job_state::Enum as S;
    state == S::Starting as i32 || state == S::Running as i32
}

/// The job's labels (Dataflow's `labels` option in any SDK's form).
fn labels(options: &Option<Struct>) -> BTreeMap<String, String> {
    options
        .as_ref()
        .and_then(|o| weir_jobs::options::validate(o).ok())
        .map(|o| o.labels)
        .unwrap_or_default()
}

fn show_labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Decodes the last varint of a payload (a sum, or a gauge's value after its timestamp).
fn last_varint(payload: &[u8], skip: usize) -> Option<u64> {
    let mut values = vec![];
    let (mut v, mut shift) = (0u64, 0);
    for b in payload {
        v |= u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            values.push(v);
            v = 0;
            shift = 0;
        }
    }
    values.get(skip).copied()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn importance_name(i: i32) -> &'static str {
    match MessageImportance::try_from(i) {
        Ok(MessageImportance::JobMessageDebug) => "DEBUG",
        Ok(MessageImportance::JobMessageDetailed) => "DETAILED",
        Ok(MessageImportance::JobMessageBasic) => "BASIC",
        Ok(MessageImportance::JobMessageWarning) => "WARNING",
        Ok(MessageImportance::JobMessageError) => "ERROR",
        _ => "UNSPECIFIED",
    }
}

/// One stage as GetJobMetrics reports it ([`weir_jobs::stage_metrics`]).
#[derive(Default, Debug)]
struct StageRow {
    name: String,
    kind: String,
    elements_in: u64,
    elements_out: u64,
    bundles: u64,
    retries: u64,
    in_flight: u64,
    input_watermark: Option<i64>,
    output_watermark: Option<i64>,
}

/// The job's stages, in pipeline order (stage ids sort as they were planned).
fn stage_rows(metrics: &[beam::MonitoringInfo]) -> Vec<StageRow> {
    use weir_jobs::stage_metrics as sm;
    let mut rows: BTreeMap<(usize, String), StageRow> = BTreeMap::new();
    for m in metrics.iter().filter(|m| m.urn.starts_with("weir:metric:stage:")) {
        let Some(id) = m.labels.get("STAGE") else { continue };
        let latest = m.r#type == weir_proto::urns::monitoring::TYPE_LATEST_INT64;
        let value = last_varint(&m.payload, usize::from(latest)).unwrap_or(0);
        // Stage ids end in their number ("...-stage-12"): sort by it.
        let number = id.rsplit(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or(usize::MAX);
        let row = rows.entry((number, id.clone())).or_default();
        row.name = m.labels.get("STAGE_NAME").cloned().unwrap_or_default();
        row.kind = m.labels.get("STAGE_KIND").cloned().unwrap_or_default();
        match m.urn.as_str() {
            sm::ELEMENTS_IN => row.elements_in = value,
            sm::ELEMENTS_OUT => row.elements_out = value,
            sm::BUNDLES => row.bundles = value,
            sm::RETRIES => row.retries = value,
            sm::IN_FLIGHT => row.in_flight = value,
            sm::INPUT_WATERMARK => row.input_watermark = Some(value as i64),
            sm::OUTPUT_WATERMARK => row.output_watermark = Some(value as i64),
            _ => {}
        }
    }
    rows.into_values().collect()
}

/// A watermark in ms as text: `done`, `-inf`, `+inf` or a UTC time.
fn watermark_text(w: Option<i64>) -> String {
    match w {
        None => "-".into(),
        Some(i64::MAX) => "done".into(),
        Some(ms) if ms <= weir_model::Timestamp::MIN.millis() => "-inf".into(),
        Some(ms) if ms >= weir_model::Timestamp::END_OF_GLOBAL_WINDOW.millis() => "+inf".into(),
        Some(ms) => when(&Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }),
    }
}

fn clip(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(n - 1).collect::<String>())
    }
}

/// A GetJobs request for every job's options, whatever the reply's size
/// (this client takes up to `weir_proto::MAX_GRPC_MESSAGE_BYTES`).
fn all_options() -> tonic::Request<beam::GetJobsRequest> {
    let mut request = tonic::Request::new(beam::GetJobsRequest {});
    request.metadata_mut().insert(
        weir_jobs::service::FULL_OPTIONS_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    request
}

/// Says on stderr when job `job_id` had already finished, so that `what`
/// (cancel, drain) has nothing to do.
async fn note_if_finished(client: &mut Client, job_id: &str, what: &str) {
    if let Some(state) = job_info(client, job_id).await.ok().map(|j| j.state).filter(|&s| is_terminal(s)) {
        eprintln!("job {job_id} had already finished ({}): nothing to {what}", state_name(state));
    }
}

/// The job `job_id` as GetJobs lists it.
async fn job_info(client: &mut Client, job_id: &str) -> anyhow::Result<beam::JobInfo> {
    client
        .get_jobs(all_options())
        .await?
        .into_inner()
        .job_info
        .into_iter()
        .find(|j| j.job_id == job_id)
        .with_context(|| format!("no job {job_id:?}"))
}

/// The job's attempted MonitoringInfos (GetJobMetrics).
async fn job_metrics(client: &mut Client, job_id: &str) -> anyhow::Result<Vec<beam::MonitoringInfo>> {
    let mut request = tonic::Request::new(beam::GetJobMetricsRequest { job_id: job_id.to_string() });
    request
        .metadata_mut()
        .insert(weir_jobs::stage_metrics::REQUEST_HEADER, tonic::metadata::MetadataValue::from_static("1"));
    Ok(client
        .get_job_metrics(request)
        .await?
        .into_inner()
        .metrics
        .unwrap_or_default()
        .attempted)
}

/// `weir jobs watch`: one line per stage (elements in and out, bundles in
/// flight, input watermark), redrawn every second until the job ends; not
/// on a terminal, the table is printed once a second instead.
async fn watch(client: &mut Client, job_id: &str) -> anyhow::Result<()> {
    use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let multi = MultiProgress::with_draw_target(if tty { ProgressDrawTarget::stdout_with_hz(4) } else { ProgressDrawTarget::hidden() });
    let style = ProgressStyle::with_template("{spinner} {prefix:.bold} {msg}").expect("a valid template");
    let header = multi.add(ProgressBar::new_spinner().with_style(ProgressStyle::with_template("{msg}").expect("a valid template")));
    let mut bars: Vec<ProgressBar> = vec![];
    loop {
        let job = job_info(client, job_id).await?;
        let state = beam::job_state::Enum::try_from(job.state).unwrap_or(beam::job_state::Enum::Unspecified);
        let rows = stage_rows(&job_metrics(client, job_id).await?);
        let title = format!("{} ({})  {}  {} stage(s)", job.job_name, job.job_id, state_name(job.state), rows.len());
        let line = |row: &StageRow| {
            format!(
                "in {:>10}  out {:>10}  in flight {:>3}  retries {}  wm {}",
                row.elements_in,
                row.elements_out,
                row.in_flight,
                row.retries,
                watermark_text(row.input_watermark)
            )
        };
        if !tty {
            // Not a terminal (a pipe, a log): the whole table once a second.
            println!("{} {title}", when(&Timestamp::from(std::time::SystemTime::now())));
            for row in &rows {
                println!("  {:<10} {:<40} {}", row.kind, clip(&row.name, 40), line(row));
            }
        }
        header.set_message(title);
        while bars.len() < rows.len() {
            let bar = multi.add(ProgressBar::new_spinner().with_style(style.clone()));
            bar.enable_steady_tick(std::time::Duration::from_millis(250));
            bars.push(bar);
        }
        for (bar, row) in bars.iter().zip(&rows) {
            bar.set_prefix(format!("{:<10} {:<40}", row.kind, clip(&row.name, 40)));
            bar.set_message(line(row));
        }
        if weir_jobs::registry::is_terminal(state) {
            for bar in &bars {
                bar.finish();
            }
            header.finish();
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Runs a `weir jobs` action against `args.endpoint`.
pub(crate) async fn run(args: JobsArgs) -> anyhow::Result<()> {
    // The server's refusal as its text and code (`job ... is a batch job: ...
    // (FailedPrecondition)`), not tonic's debug form of the whole status.
    act(args).await.map_err(|e| match e.downcast_ref::<tonic::Status>() {
        Some(status) => anyhow::anyhow!("{} ({:?})", status.message(), status.code()),
        None => e,
    })
}

async fn act(args: JobsArgs) -> anyhow::Result<()> {
    let url = weir_proto::grpc_uri(&args.endpoint);
    let header = match token(&args)? {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .context("the Job API token must be printable ASCII")?,
        ),
        None => None,
    };
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("bad endpoint {}", args.endpoint))?
        .connect()
        .await
        .with_context(|| format!("cannot reach the Job API at {}", args.endpoint))?;
    let mut client = JobServiceClient::with_interceptor(channel, AddToken(header))
        .max_decoding_message_size(weir_proto::MAX_GRPC_MESSAGE_BYTES);
    match args.action {
        JobsAction::List => {
            let jobs = client
                .get_jobs(all_options())
                .await?
                .into_inner()
                .job_info;
            println!("JOB_ID\tSTATE\tNAME\tSTART\tEND\tLABELS");
            // By start (a job not started yet: by its Prepare), oldest first.
            let mut rows = Vec::with_capacity(jobs.len());
            for j in jobs {
                // A job forgotten meanwhile (registry bound) is listed without times, first.
                let history = states(&mut client, &j.job_id).await.unwrap_or_default();
                let first = history
                    .iter()
                    .find(|(_, s)| has_started(*s))
                    .or(history.first())
                    .and_then(|(t, _)| t.as_ref())
                    .map(|t| (t.seconds, t.nanos));
                rows.push((first, j.job_id.clone(), j, start_end(&history)));
            }
            rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            for (_, _, j, (start, end)) in rows {
                println!(
                    "{}\t{}\t{}\t{start}\t{end}\t{}",
                    j.job_id,
                    state_name(j.state),
                    j.job_name,
                    show_labels(&labels(&j.pipeline_options))
                );
            }
        }
        JobsAction::Describe { job_id } => {
            let job = job_info(&mut client, &job_id).await?;
            println!("id:    {}", job.job_id);
            println!("name:  {}", job.job_name);
            println!("state: {}", state_name(job.state));
            let history = states(&mut client, &job_id).await?;
            let (start, end) = start_end(&history);
            println!("start: {start}");
            println!("end:   {end}");
            println!("labels: {}", show_labels(&labels(&job.pipeline_options)));
            let metrics = job_metrics(&mut client, &job_id).await?;
            let value = |urn: &str| {
                metrics.iter().find(|m| m.urn == urn).and_then(|m| {
                    let skip =
                        usize::from(m.r#type == weir_proto::urns::monitoring::TYPE_LATEST_INT64);
                    last_varint(&m.payload, skip)
                })
            };
            println!("resources:");
            match value(resources::RUNNER_CPU_MSECS) {
                None => println!("  not measured (the job has not run)"),
                Some(cpu) => {
                    println!(
                        "  runner: {:.2} CPU s since the job started, memory {} (peak {}) (the whole server process)",
                        cpu as f64 / 1000.0,
                        mib(value(resources::RUNNER_MEMORY_BYTES).unwrap_or(0)),
                        mib(value(resources::RUNNER_PEAK_MEMORY_BYTES).unwrap_or(0)),
                    );
                    match value(resources::SDK_PROCESSES).unwrap_or(0) {
                        0 => println!("  SDK: not measured (no SDK process started by Weir: with LOOPBACK or EXTERNAL the harness runs in another process)"),
                        n => println!(
                            "  SDK: {n} process(es), {:.2} CPU s, memory {} (peak {})",
                            value(resources::SDK_CPU_MSECS).unwrap_or(0) as f64 / 1000.0,
                            mib(value(resources::SDK_MEMORY_BYTES).unwrap_or(0)),
                            mib(value(resources::SDK_PEAK_MEMORY_BYTES).unwrap_or(0)),
                        ),
                    }
                }
            }
            let user = metrics
                .iter()
                .filter(|m| m.urn.starts_with("beam:metric:user:"))
                .count();
            println!(
                "  metrics: {} MonitoringInfos, {user} of them user metrics",
                metrics.len()
            );
            if let Some(cells) = value(weir_harness::metrics::LIVE_CELLS_URN) {
                println!(
                    "  user state: {cells} live cell(s), peak {}; about {}, peak {} (state of expired windows is deleted)",
                    value(weir_harness::metrics::PEAK_LIVE_CELLS_URN).unwrap_or(cells),
                    mib(value(weir_harness::metrics::LIVE_BYTES_URN).unwrap_or(0)),
                    mib(value(weir_harness::metrics::PEAK_LIVE_BYTES_URN).unwrap_or(0)),
                );
            }
            let rows = stage_rows(&metrics);
            if !rows.is_empty() {
                println!("stages:");
                println!("  {:<10} {:<48} {:>10} {:>10} {:>8} {:>7}  INPUT WATERMARK", "KIND", "STAGE", "IN", "OUT", "BUNDLES", "RETRIES");
                for r in &rows {
                    println!(
                        "  {:<10} {:<48} {:>10} {:>10} {:>8} {:>7}  {}",
                        r.kind,
                        clip(&r.name, 48),
                        r.elements_in,
                        r.elements_out,
                        r.bundles,
                        r.retries,
                        watermark_text(r.input_watermark)
                    );
                }
            }
            println!("history:");
            for (at, state) in history {
                let at = at.as_ref().map(when).unwrap_or_default();
                println!("  {at}  {}", state_name(state));
            }
            println!("options:");
            let mut options: Vec<_> = job
                .pipeline_options
                .map(|o| o.fields.into_iter().collect())
                .unwrap_or_default();
            options.sort_by(|a: &(String, Value), b| a.0.cmp(&b.0));
            for (k, v) in options {
                let name = k
                    .strip_prefix("beam:option:")
                    .and_then(|k| k.strip_suffix(":v1"))
                    .unwrap_or(&k)
                    .to_string();
                println!("  {name} = {}", show(&v));
            }
        }
        JobsAction::Logs { job_id, follow } => {
            let request = beam::JobMessagesRequest {
                job_id: job_id.clone(),
            };
            let mut request = if follow {
                tonic::Request::new(request)
            } else {
                history_only(request)
            };
            request.metadata_mut().insert(
                weir_jobs::service::LOGS_HEADER,
                tonic::metadata::MetadataValue::from_static("all"),
            );
            let mut stream = client.get_message_stream(request).await?.into_inner();
            while let Some(event) = stream.next().await {
                match event?.response {
                    Some(Event::MessageResponse(m)) => println!(
                        "{}\t{}\t{}",
                        when_text(&m.time),
                        importance_name(m.importance),
                        m.message_text
                    ),
                    Some(Event::StateResponse(s)) => println!(
                        "{}\tSTATE\t{}",
                        s.timestamp.as_ref().map(when).unwrap_or_default(),
                        state_name(s.state)
                    ),
                    None => {}
                }
            }
        }
        JobsAction::Watch { job_id } => watch(&mut client, &job_id).await?,
        JobsAction::Drain { job_id } => {
            note_if_finished(&mut client, &job_id, "drain").await;
            let state = client
                .drain(beam::DrainJobRequest {
                    job_id: job_id.clone(),
                })
                .await?
                .into_inner()
                .state;
            println!("{job_id}\t{}", state_name(state));
        }
        JobsAction::Cancel { job_id } => {
            note_if_finished(&mut client, &job_id, "cancel").await;
            let state = client
                .cancel(beam::CancelJobRequest {
                    job_id: job_id.clone(),
                })
                .await?
                .into_inner()
                .state;
            println!("{job_id}\t{}", state_name(state));
        }
    }
    Ok(())
}
