"""The catalogue of type names: every envelope ``type`` and every event ``type``.

Both tables are ``StrEnum``s, so a member *is* its string: it compares equal to the literal,
hashes like it, and msgpack, JSON and SQLite write exactly the same bytes for it (checked by
``tests/test_catalogue.py``); pydantic stores it as a plain ``str``. The wire never changes
when code passes a member where it passed the literal. ``docs/protocol.md`` documents each
type; the same test checks that the tables, the docs and the code agree.

Not to be confused with :class:`ratchet.protocol.states.TaskEvent`, the inputs of the task
state machine (``dispatched``, ``failed``, ...), which are not on the wire.
"""

from __future__ import annotations

from enum import StrEnum, unique

__all__ = ["ADMIN_TYPE_PREFIX", "EventType", "MessageType", "admin_type"]


@unique  # a repeated value would silently make an alias, not a second member
class MessageType(StrEnum):
    """The ``type`` of an envelope: what a command or mail message asks of its receiver."""

    #: A client's submission: on ``ratchet.submit.<tenant>`` or the API's ``submit``.
    TASK_SUBMIT = "task.submit"
    #: The API's ``get``: a task's snapshot.
    TASK_GET = "task.get"
    #: Mail from intake (or the admin ``fork``) to a task actor: run the task.
    TASK_START = "task.start"
    #: In process only, from the admin service to a task actor: cancel, pause or resume.
    TASK_CONTROL = "task.control"
    #: A human's decision on ``ratchet.decisions.<tenant>`` (or the admin approve/reject),
    #: forwarded to the task as mail.
    APPROVAL_DECISION = "approval.decision"
    #: A provider's confirmation on ``ratchet.external.<tenant>``, forwarded as mail.
    EXTERNAL_RESOLVED = "external.resolved"
    #: Mail from the node that ran fan-out branches to their task: these settled (the join
    #: reads their rows before it counts them).
    BRANCH_DONE = "branch.done"
    #: Mail from a task to the partition its fan-out branches are placed on: run these
    #: branches, each from its row's progress (``ratchet.mail.<partition>.<task>.branches``).
    BRANCH_START = "branch.start"
    #: Mail from a task to its branches' partitions: stop them at their next safe point,
    #: RUNNING (the task pauses).
    BRANCH_HOLD = "branch.hold"
    #: Mail from a task to its branches' partitions: cancel them now (the join decided, the
    #: task ended, a branch timed out).
    BRANCH_STOP = "branch.stop"
    #: In process only, from the timer service to a task actor: a timer is due.
    TIMER_FIRED = "timer.fired"
    #: In process only, from the admin service to a task actor: a human settles an action
    #: or a handoff (``resolve``, ``retry-action``, ``skip-step``; actors/task/settle.py).
    TASK_SETTLE = "task.settle"


#: Admin commands are typed ``admin.<verb>``, one type per verb of
#: ``protocol.admin_verbs.VERB_ROLES``: a family, not members of :class:`MessageType`.
ADMIN_TYPE_PREFIX = "admin."


def admin_type(verb: str) -> str:
    """The envelope type of the admin command ``verb`` (``admin.cancel``)."""
    return f"{ADMIN_TYPE_PREFIX}{verb}"


@unique
class EventType(StrEnum):
    """The ``type`` of every event a task's event stream can carry (payloads: protocol.md)."""

    # -- the task's life -------------------------------------------------------------------
    #: Accepted (sequence 1).
    TASK_QUEUED = "task.queued"
    #: Dispatched: QUEUED → RUNNING.
    TASK_STARTED = "task.started"
    #: A fresh actor resumes a RUNNING task (restart, node recovery, failover, hand-over).
    TASK_RECOVERED = "task.recovered"
    #: The crash-loop guard handed a task that kept crashing to a human.
    TASK_RECOVERY_STOPPED = "task.recovery_stopped"
    #: A step-boundary heartbeat, at most once per progress interval.
    TASK_PROGRESS = "task.progress"
    #: About a node, not a task (``ratchet.events._system.<node_id>.>``): its wall clock
    #: stepped by more than the threshold.
    NODE_CLOCK_STEPPED = "node.clock_stepped"
    #: About a node: at its start, the audit chain did not verify against the key and head
    #: of its state directory (entries edited, deleted or rewritten).
    NODE_AUDIT_TAMPERED = "node.audit_tampered"
    #: Terminal: the workflow reached END.
    TASK_SUCCEEDED = "task.succeeded"
    #: Terminal: the task failed (after its saga, if any).
    TASK_FAILED = "task.failed"
    #: Terminal: an operator's cancel, or an approval timed out with ``on_timeout="cancel"``.
    TASK_CANCELLED = "task.cancelled"
    #: A cancel's compensation failed for good; a handoff follows.
    TASK_CANCEL_INCOMPLETE = "task.cancel_incomplete"
    #: An operator's cancel was recorded (side-channel); the effect follows.
    TASK_CANCEL_REQUESTED = "task.cancel_requested"
    #: An operator's pause was recorded (side-channel); the effect follows.
    TASK_PAUSE_REQUESTED = "task.pause_requested"
    #: QUEUED or RUNNING → PAUSED.
    TASK_PAUSED = "task.paused"
    #: PAUSED → QUEUED.
    TASK_RESUMED = "task.resumed"
    #: The task's workflow version is registered with another definition than the one it
    #: started on: it pauses at its next safe point (actors/task/definition_guard.py).
    TASK_DEFINITION_CHANGED = "task.definition_changed"
    #: An operator moved the task to another workflow version (``admin migrate``), with a
    #: checkpoint of its migrated state; its status is unchanged.
    TASK_MIGRATED = "task.migrated"
    #: RUNNING → WAITING_EXTERNAL: a provider accepted a write.
    TASK_WAITING_EXTERNAL = "task.waiting_external"
    #: → UNKNOWN, with a handoff: an outcome nobody can decide alone.
    TASK_UNKNOWN = "task.unknown"
    #: → WAITING_APPROVAL, with a handoff: a human must decide.
    TASK_HANDOFF = "task.handoff"
    #: UNKNOWN or WAITING_APPROVAL → RUNNING: a human settled what stopped the task.
    TASK_HUMAN_RESOLVED = "task.human_resolved"

    # -- steps -----------------------------------------------------------------------------
    #: A step's checkpoint committed.
    STEP_COMPLETED = "step.completed"
    #: A step raised.
    STEP_FAILED = "step.failed"
    #: A step abandoned by a cancel (nothing of it committed).
    STEP_INTERRUPTED = "step.interrupted"
    #: A human skipped a step the workflow declares skippable (``admin skip-step``).
    STEP_SKIPPED = "step.skipped"

    # -- the action protocol (side effects) ------------------------------------------------
    #: The first attempt of a call, and again before each retry's call.
    ACTION_STARTED = "action.started"
    #: The call succeeded.
    ACTION_SUCCEEDED = "action.succeeded"
    #: The call failed for good.
    ACTION_FAILED = "action.failed"
    #: The call's outcome is not known (or it was in flight when the task was cancelled).
    ACTION_UNKNOWN = "action.unknown"
    #: The provider was queried and the outcome settled.
    ACTION_RECONCILED = "action.reconciled"
    #: A retry is scheduled.
    ACTION_RETRY = "action.retry"
    #: The provider accepted the request and will confirm later.
    ACTION_ACCEPTED = "action.accepted"
    #: The provider's confirmation arrived.
    ACTION_CONFIRMED = "action.confirmed"
    #: Queried at the wait's timeout: still pending at the provider.
    ACTION_STILL_PENDING = "action.still_pending"
    #: The key's recorded result was reused, no call made.
    ACTION_REUSED = "action.reused"
    #: A sandbox fork answered the call without the provider: a stub, the original's
    #: recording, or a refusal (``answer``: ``stub``, ``recorded``, ``blocked``).
    ACTION_SANDBOXED = "action.sandboxed"
    #: A saga undid the action.
    ACTION_COMPENSATED = "action.compensated"
    #: A cancel arrived while the call was in flight: the task waits for its outcome.
    ACTION_CANCELLING = "action.cancelling"
    #: The call outlived the cancel timeout: the task ended without its outcome, which the
    #: action sweeper settles later (docs/side-effects.md, "Settling").
    ACTION_DETACHED = "action.detached"
    #: A human settled the action with evidence (``admin resolve``) or had it re-sent
    #: under its key (``admin retry-action``).
    ACTION_HUMAN_RESOLVED = "action.human_resolved"
    #: A read's answer, as a replay gives it back (actors/task/read_record.py).
    ACTION_READ = "action.read"

    # -- graph moves, fan-out and fan-in ---------------------------------------------------
    #: A choice node moved the task.
    EDGE_TAKEN = "edge.taken"
    #: A routing table moved the task.
    ROUTE_TAKEN = "route.taken"
    #: A fan-out's branch rows committed.
    FANOUT_STARTED = "fanout.started"
    #: A branch committed a step (its progress: where it goes on after a crash).
    BRANCH_STEP_COMPLETED = "branch.step_completed"
    #: A failed branch runs again from its last committed step (``branch_retries``, or an
    #: operator's ``retry-branch``).
    BRANCH_RETRIED = "branch.retried"
    #: A branch succeeded.
    BRANCH_COMPLETED = "branch.completed"
    #: A branch raised or tried to suspend.
    BRANCH_FAILED = "branch.failed"
    #: A branch's timeout passed.
    BRANCH_TIMED_OUT = "branch.timed_out"
    #: The join policy decided: go on.
    JOIN_COMPLETED = "join.completed"
    #: The join policy decided: the task fails.
    JOIN_FAILED = "join.failed"

    # -- approvals and external waits ------------------------------------------------------
    #: RUNNING → WAITING_APPROVAL at an approval node.
    APPROVAL_REQUESTED = "approval.requested"
    #: A decision applied (also on a crash-loop handoff).
    APPROVAL_DECIDED = "approval.decided"
    #: No decision in time: escalated, or the task cancelled.
    APPROVAL_TIMED_OUT = "approval.timed_out"
    #: RUNNING → WAITING_EXTERNAL at a wait node.
    WAIT_STARTED = "wait.started"
    #: The awaited message arrived.
    WAIT_COMPLETED = "wait.completed"
    #: No message in time.
    WAIT_TIMED_OUT = "wait.timed_out"
    #: A resumed task's plan re-validated (actors/task/revalidate.py): the hook's verdict.
    PLAN_REVALIDATED = "plan.revalidated"
    #: RUNNING → SLEEPING at a sleep node (its wake time, and the timer's due time).
    SLEEP_STARTED = "sleep.started"
    #: SLEEPING → RUNNING: the wake time came; the task moves on.
    SLEEP_COMPLETED = "sleep.completed"

    # -- any node ---------------------------------------------------------------------------
    #: A watched node left the state as it found it ``repeat`` times (actors/task/node_guard.py).
    NODE_LOOP_SUSPECTED = "node.loop_suspected"
    #: It did again: the task goes along the workflow's ``on_loop`` route, or fails.
    NODE_LOOP_DETECTED = "node.loop_detected"

    #: A reconcile pass found an external object changed since the ledger recorded it.
    DRIFT_DETECTED = "drift.detected"

    # -- agent nodes -----------------------------------------------------------------------
    #: An agent turn committed.
    AGENT_TURN = "agent.turn"
    #: A final answer validated.
    AGENT_ANSWERED = "agent.answered"
    #: A final answer failed the output model; a repair message goes back.
    AGENT_REPAIR = "agent.repair"
    #: A loop detected the first time; a corrective message goes back.
    AGENT_INTERVENTION = "agent.intervention"
    #: A loop detected again.
    AGENT_LOOP_DETECTED = "agent.loop_detected"
    #: A budget dimension spent, or ``max_turns`` reached.
    AGENT_BUDGET_EXHAUSTED = "agent.budget_exhausted"
    #: A turn answered by a fallback model or the answer cache, or by none of them.
    AGENT_DEGRADED = "agent.degraded"
    #: A long conversation folded into a summary before a turn.
    AGENT_COMPACTED = "agent.compacted"
