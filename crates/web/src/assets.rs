//! The web UI's files, embedded in the binary: Weir's own pages, script and
//! style (`crates/web/assets/`), and dagre, the graph layout library from
//! the npm registry (`ui/node_modules`, installed by `npm ci --prefix ui`).

/// The jobs list page.
pub const JOBS_HTML: &str = include_str!("../assets/jobs.html");
/// A job's page (the job id is read from the URL by the script).
pub const JOB_HTML: &str = include_str!("../assets/job.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");
const DAGRE_JS: &str = include_str!(env!("WEIR_DAGRE_JS"));

/// The asset `name` under `/assets/` and its MIME type.
pub fn get(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "app.js" => Some((APP_JS, "text/javascript; charset=utf-8")),
        "style.css" => Some((STYLE_CSS, "text/css; charset=utf-8")),
        "dagre.min.js" => Some((DAGRE_JS, "text/javascript; charset=utf-8")),
        _ => None,
    }
}
