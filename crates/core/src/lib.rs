//! The countersign domain, with no I/O.
//!
//! This crate decides what countersign does: the tool and preview contracts, the user directory
//! that says who a user is and whether they may approve, which tools an agent is offered, the
//! tool loop that runs a turn or suspends it for approval, the bounds on previews, the
//! suspended state and its tolerant rehydration, the turn digest a decision binds to, the
//! comparator that binds an approval to what its approver was shown, and the approval card.
//!
//! It must never do I/O of its own: no database, no broker, no network, no clock, no files.
//! Everything outside — the model, the tools, the users, the lease fence and the execution
//! journal — is reached through the traits defined here, so every rule can be tested without a
//! service.
//!
//! Foreign producers of decisions compute the turn digest themselves: its canonical form is
//! specified in [`digest`].

pub mod agent_loop;
pub mod approval;
pub mod card;
pub mod comparator;
pub mod decision;
pub mod digest;
pub mod directory;
pub mod errors;
pub mod execution;
pub mod fields;
pub mod ids;
pub mod local_writer;
pub mod messages;
pub mod model;
pub mod preview;
pub mod quorum;
pub mod segment;
pub mod sequence;
pub mod state;
pub mod told;
pub mod tool;

pub use decision::{CallEdit, Decision};
pub use directory::{Approver, Approves, DirectoryError, UserDirectory};
pub use errors::{DatabaseCode, HookError, PREVIEW_CONFLICT};
pub use ids::{CallIndex, IdError, LeaseEpoch, RunId, SuspensionSeq, TurnDigest};
pub use local_writer::{
    JournalEntry, LocalWriter, LocalWriters, LockMode, LockSubject, PlannedWrite,
};
pub use messages::{
    ArgumentsEdit, CallVerdict, DecisionMessage, Event, EventName, MessageError, RunRequest,
    MESSAGE_VERSION,
};
pub use model::{
    Message, Model, ModelError, ModelOptions, ModelRequest, ModelResponse, Role, TokenUsage,
    ToolCall,
};
pub use preview::{CallPreview, LineForm, PreviewLine};
pub use segment::{
    AgentConfig, Interruption, Outcome, Segment, SegmentHooks, TerminationReason, TurnRecord,
    DEFAULT_MAX_TOOL_CALLS_PER_TURN,
};
pub use state::{EditRecord, LandedCall, PendingCall, StateError, SuspendedRunState, ToolIdentity};
pub use tool::{
    ArgumentsError, CallStatus, DataClass, DataClasses, EarlierCall, Effect, ExecContext,
    ExternalWrite, Fault, FenceToken, OfferedTools, Prepared, Principal, Profile, Sequence, Tool,
    ToolError, ToolOutput, ToolPolicy, ToolPreview, ToolRegistry, ToolSpec, Withheld,
};
