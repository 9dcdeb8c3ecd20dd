//! POSIX ACLs: ext4's compact on-disk form (`fs/ext4/acl.h`: version 1,
//! 4-byte entries for the owner/group/mask/other tags, 8-byte entries with
//! an id for named users and groups) and the `posix_acl_xattr` form that
//! `getxattr("system.posix_acl_*")` returns and getfacl reads (version 2,
//! every entry 8 bytes, id -1 where there is none).

/// `e_tag` values.
pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;
/// The id of entries without one.
pub const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// Version word of the ext4 on-disk form.
pub const EXT4_ACL_VERSION: u32 = 1;
/// Version word of the xattr form.
pub const POSIX_ACL_XATTR_VERSION: u32 = 2;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    /// uid/gid for `ACL_USER`/`ACL_GROUP`, else [`ACL_UNDEFINED_ID`].
    pub id: u32,
}

fn le16(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn le32(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

/// Parse ext4's on-disk ACL; `Err` names the problem.
pub fn from_disk(v: &[u8]) -> Result<Vec<AclEntry>, &'static str> {
    if le32(v, 0) != Some(EXT4_ACL_VERSION) {
        return Err("ACL version is not 1");
    }
    let mut out = Vec::new();
    let mut off = 4;
    while off < v.len() {
        let tag = le16(v, off).ok_or("truncated ACL entry")?;
        let perm = le16(v, off + 2).ok_or("truncated ACL entry")?;
        match tag {
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {
                out.push(AclEntry {
                    tag,
                    perm,
                    id: ACL_UNDEFINED_ID,
                });
                off += 4;
            }
            ACL_USER | ACL_GROUP => {
                let id = le32(v, off + 4).ok_or("truncated ACL entry")?;
                out.push(AclEntry { tag, perm, id });
                off += 8;
            }
            _ => return Err("unknown ACL entry tag"),
        }
    }
    Ok(out)
}

/// Serialize to ext4's on-disk form.
pub fn to_disk(entries: &[AclEntry]) -> Vec<u8> {
    let mut v = EXT4_ACL_VERSION.to_le_bytes().to_vec();
    for e in entries {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        if matches!(e.tag, ACL_USER | ACL_GROUP) {
            v.extend_from_slice(&e.id.to_le_bytes());
        }
    }
    v
}

/// Serialize to the `posix_acl_xattr` form (what getfacl reads).
pub fn to_xattr(entries: &[AclEntry]) -> Vec<u8> {
    let mut v = POSIX_ACL_XATTR_VERSION.to_le_bytes().to_vec();
    for e in entries {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        let id = if matches!(e.tag, ACL_USER | ACL_GROUP) {
            e.id
        } else {
            ACL_UNDEFINED_ID
        };
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Parse the `posix_acl_xattr` form.
pub fn from_xattr(v: &[u8]) -> Result<Vec<AclEntry>, &'static str> {
    if le32(v, 0) != Some(POSIX_ACL_XATTR_VERSION) {
        return Err("ACL xattr version is not 2");
    }
    if !(v.len() - 4).is_multiple_of(8) {
        return Err("ACL xattr size is not a whole number of entries");
    }
    v[4..]
        .chunks(8)
        .map(|c| {
            let tag = le16(c, 0).ok_or("truncated ACL entry")?;
            let perm = le16(c, 2).ok_or("truncated ACL entry")?;
            let id = le32(c, 4).ok_or("truncated ACL entry")?;
            match tag {
                ACL_USER | ACL_GROUP => Ok(AclEntry { tag, perm, id }),
                ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => Ok(AclEntry {
                    tag,
                    perm,
                    id: ACL_UNDEFINED_ID,
                }),
                _ => Err("unknown ACL entry tag"),
            }
        })
        .collect()
}

/// getfacl's text lines (`user::rw-`, `user:1000:r--`, ...), numeric ids.
pub fn to_text(entries: &[AclEntry]) -> Vec<String> {
    let rwx = |p: u16| {
        format!(
            "{}{}{}",
            if p & 4 != 0 { 'r' } else { '-' },
            if p & 2 != 0 { 'w' } else { '-' },
            if p & 1 != 0 { 'x' } else { '-' }
        )
    };
    entries
        .iter()
        .map(|e| match e.tag {
            ACL_USER_OBJ => format!("user::{}", rwx(e.perm)),
            ACL_USER => format!("user:{}:{}", e.id, rwx(e.perm)),
            ACL_GROUP_OBJ => format!("group::{}", rwx(e.perm)),
            ACL_GROUP => format!("group:{}:{}", e.id, rwx(e.perm)),
            ACL_MASK => format!("mask::{}", rwx(e.perm)),
            _ => format!("other::{}", rwx(e.perm)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let acl = vec![
            AclEntry {
                tag: ACL_USER_OBJ,
                perm: 6,
                id: ACL_UNDEFINED_ID,
            },
            AclEntry {
                tag: ACL_USER,
                perm: 4,
                id: 1000,
            },
            AclEntry {
                tag: ACL_GROUP_OBJ,
                perm: 4,
                id: ACL_UNDEFINED_ID,
            },
            AclEntry {
                tag: ACL_MASK,
                perm: 4,
                id: ACL_UNDEFINED_ID,
            },
            AclEntry {
                tag: ACL_OTHER,
                perm: 0,
                id: ACL_UNDEFINED_ID,
            },
        ];
        let d = to_disk(&acl);
        assert_eq!(d.len(), 4 + 4 + 8 + 4 + 4 + 4);
        assert_eq!(from_disk(&d).unwrap(), acl);
        let x = to_xattr(&acl);
        assert_eq!(x.len(), 4 + 5 * 8);
        assert_eq!(from_xattr(&x).unwrap(), acl);
        assert_eq!(to_text(&acl)[1], "user:1000:r--");
        assert!(from_disk(&x).is_err());
        assert!(from_disk(&d[..d.len() - 2]).is_err());
    }
}
