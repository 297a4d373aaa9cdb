//! `/api/schedules`: the schedules in the ledger, added, paused, resumed
//! and removed by an operator ([`stephost_runtime::schedules`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use stephost_core::schedules::{Overlap, Schedule};
use stephost_runtime::schedules::{self as runtime, CATCH_UP_MS_DEFAULT, NewSchedule};

use crate::access::Caller;
use crate::api::ModuleRef;
use crate::app::{App, Fits, Operator};
use crate::errors::ApiError;

type Api<T> = Result<Json<T>, ApiError>;

/// A schedule to add: the build as a module (`module_digest` or
/// `module_base64`) or a `step` the ledger has run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddBody {
    pub name: String,
    pub cron: String,
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(flatten)]
    pub module: ModuleRef,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub input: Option<serde_json::Value>,
    #[serde(default)]
    pub overlap: Option<String>,
    #[serde(default, deserialize_with = "crate::api::whole_or_none")]
    pub catch_up_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Removed {
    pub removed: String,
}

pub async fn list(State(app): State<Arc<App>>, _caller: Caller) -> Api<Vec<Schedule>> {
    Ok(Json(
        app.with_host(|host| Ok(host.schedules()?.list()?)).await?,
    ))
}

pub async fn add(
    State(app): State<Arc<App>>,
    _operator: Operator,
    _fits: Fits,
    body: Result<Json<AddBody>, JsonRejection>,
) -> Result<(StatusCode, Json<Schedule>), ApiError> {
    let Json(body) = body?;
    let overlap = match body.overlap.as_deref() {
        None => Overlap::Skip,
        Some(text) => Overlap::parse(text).map_err(ApiError::bad_input)?,
    };
    let input = serde_json::to_string(&body.input.unwrap_or(serde_json::json!({})))
        .map_err(|e| ApiError::bad_input(format!("input: {e}")))?;
    let catch_up_ms = match body.catch_up_ms {
        None => CATCH_UP_MS_DEFAULT,
        Some(ms) => {
            i64::try_from(ms).map_err(|_| ApiError::bad_input("catch_up_ms is past 2^63 - 1"))?
        }
    };
    let new = NewSchedule {
        name: body.name,
        cron: body.cron,
        timezone: body.timezone.unwrap_or_else(|| "UTC".into()),
        input,
        overlap,
        catch_up_ms,
    };
    let added = app
        .with_host(move |host| {
            let module = body.module.bytes(host)?;
            if module.is_some() && body.step.is_some() {
                return Err(ApiError::bad_input(
                    "name the build by module_digest, module_base64 or step: one of them",
                ));
            }
            let module = module
                .as_ref()
                .map(|(b, what)| (b.as_slice(), what.as_str()));
            Ok(host.add_schedule(module, body.step.as_deref(), new)?)
        })
        .await?;
    Ok((StatusCode::CREATED, Json(added)))
}

pub async fn pause(
    State(app): State<Arc<App>>,
    _operator: Operator,
    path: Result<Path<String>, PathRejection>,
) -> Api<Schedule> {
    let Path(name) = path?;
    set_paused(app, name, true).await
}

pub async fn resume(
    State(app): State<Arc<App>>,
    _operator: Operator,
    path: Result<Path<String>, PathRejection>,
) -> Api<Schedule> {
    let Path(name) = path?;
    set_paused(app, name, false).await
}

async fn set_paused(app: Arc<App>, name: String, paused: bool) -> Api<Schedule> {
    Ok(Json(
        app.with_host(move |host| {
            Ok(runtime::set_paused(
                host.schedules()?.as_ref(),
                &name,
                paused,
            )?)
        })
        .await?,
    ))
}

pub async fn remove(
    State(app): State<Arc<App>>,
    _operator: Operator,
    path: Result<Path<String>, PathRejection>,
) -> Api<Removed> {
    let Path(name) = path?;
    app.with_host(move |host| {
        runtime::remove(host.schedules()?.as_ref(), &name)?;
        Ok(Json(Removed { removed: name }))
    })
    .await
}
