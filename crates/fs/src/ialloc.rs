//! Inode allocation (placeholder).
