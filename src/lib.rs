//! berth: a durable, ordered task engine for edge nodes.
//!
//! Data flows one way: the CLI and daemon call the engine, the engine calls
//! the store, the store frames records with the codec. See ARCHITECTURE.md.

pub mod alloc;
pub mod archive;
pub mod attempt_view;
pub mod backoff;
pub mod backup;
pub mod budget;
pub mod checkpoint;
pub mod clock;
pub mod codec;
pub mod compaction;
pub mod config;
pub mod control;
pub mod engine;
pub mod frame;
pub mod groups;
pub mod metrics;
pub mod ops;
pub mod queues;
pub mod replay;
pub mod report;
pub mod retention;
pub mod routing;
pub mod store;
pub mod submit;
pub mod task;
pub mod threads;
pub mod timeline;
pub mod transfer;
pub mod ttl;
pub mod units;
