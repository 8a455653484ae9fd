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
pub mod digest;
pub mod directory;
pub mod fields;
pub mod ids;
pub mod messages;
pub mod model;
pub mod preview;
pub mod sequence;
pub mod state;
pub mod tool;
pub mod turn;

pub use agent_loop::{
    AgentConfig, CallEdit, Decision, HookError, Interruption, Outcome, Segment, SegmentHooks,
    TerminationReason, TurnRecord,
};
pub use directory::{Approver, Approves, DirectoryError, UserDirectory};
pub use ids::{CallIndex, IdError, LeaseEpoch, RunId, SuspensionSeq, TurnDigest};
pub use messages::{
    ArgumentsEdit, CallVerdict, DecisionMessage, Event, EventName, MessageError, RunRequest,
    MESSAGE_VERSION,
};
pub use model::{
    Message, Model, ModelError, ModelOptions, ModelRequest, ModelResponse, Role, TokenUsage,
    ToolCall,
};
pub use preview::{CallPreview, LineForm, PreviewLine};
pub use state::{EditRecord, LandedCall, PendingCall, StateError, SuspendedRunState, ToolIdentity};
pub use tool::{
    ArgumentsError, CallStatus, DataClass, DataClasses, EarlierCall, Effect, ExecContext,
    ExternalWrite, Fault, FenceToken, OfferedTools, Prepared, Principal, Profile, Sequence, Tool,
    ToolError, ToolOutput, ToolPolicy, ToolPreview, ToolRegistry, ToolSpec, Withheld,
};
pub use turn::{JournalEntry, LocalWriter, LocalWriters, LockMode, LockSubject, PlannedWrite};
