//! What the workspace's tests share. Tests start the real servers they need, on free loopback
//! ports, and never reach a server they did not start.

pub mod redis;
