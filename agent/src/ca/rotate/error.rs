//! What a rotation command says when it is refused or fails.

use crate::ca::rotation::Stage;
use crate::pass::ops::OpsError;
use crate::sys::state::StateError;

/// A rotation refused or failed; each says what happened to the files and what to do.
#[derive(Debug)]
pub enum RotateError {
    /// Refused before anything changed.
    Refused(String),
    /// Stopped after earlier stages of this command changed files (they stand, recorded).
    Stopped(String),
    /// The rotation state file cannot be used.
    State(StateError),
    /// Locking, recovery, the transaction or the pass state.
    Ops(OpsError),
    /// A stage's pass failed (exit code of `run --once`): the stage stays in progress.
    Pass {
        stage: Stage,
        exit: u8,
        detail: String,
    },
    /// The files after a stage are not what it wants.
    Check { stage: Stage, detail: String },
}

impl std::fmt::Display for RotateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RotateError::Refused(s) => write!(f, "{s}; nothing was changed"),
            RotateError::Stopped(s) => write!(
                f,
                "{s}; what the stages before did stands (recorded on this node): run the same \
                 command again"
            ),
            RotateError::State(e) => write!(f, "{e}"),
            RotateError::Ops(e) => write!(f, "{e}"),
            RotateError::Pass {
                stage,
                exit,
                detail,
            } => write!(
                f,
                "stage {}: the pass failed (exit {exit}): {detail}; the stage stays in progress: \
                 run the same command again, or 'certrotor ca abort'",
                stage.name()
            ),
            RotateError::Check { stage, detail } => write!(
                f,
                "stage {}: {detail}; the stage stays in progress: run the same command again, or \
                 'certrotor ca abort'",
                stage.name()
            ),
        }
    }
}

impl std::error::Error for RotateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RotateError::Ops(e) => Some(e),
            RotateError::State(e) => Some(e),
            _ => None,
        }
    }
}

impl From<OpsError> for RotateError {
    fn from(e: OpsError) -> Self {
        RotateError::Ops(e)
    }
}

impl From<StateError> for RotateError {
    fn from(e: StateError) -> Self {
        RotateError::State(e)
    }
}
