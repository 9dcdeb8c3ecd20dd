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

/// The permission bits an entry may carry (`ACL_READ | ACL_WRITE | ACL_EXECUTE`).
pub const ACL_PERM_MASK: u16 = 7;

/// The kernel's `posix_acl_valid`: every perm within rwx, exactly one
/// `USER_OBJ`, `GROUP_OBJ` and `OTHER`, in the order USER_OBJ, USER...,
/// GROUP_OBJ, GROUP..., MASK, OTHER, and a MASK whenever there is a named
/// USER or GROUP entry. (The kernel no longer checks the order of the ids.)
pub fn validate(entries: &[AclEntry]) -> Result<(), &'static str> {
    #[derive(PartialEq)]
    enum St {
        UserObj,
        User,
        Group,
        Other,
        Done,
    }
    let mut st = St::UserObj;
    let mut needs_mask = false;
    for e in entries {
        if e.perm & !ACL_PERM_MASK != 0 {
            return Err("ACL entry with permission bits other than rwx");
        }
        st = match (e.tag, &st) {
            (ACL_USER_OBJ, St::UserObj) => St::User,
            (ACL_USER, St::User) => {
                needs_mask = true;
                St::User
            }
            (ACL_GROUP_OBJ, St::User) => St::Group,
            (ACL_GROUP, St::Group) => {
                needs_mask = true;
                St::Group
            }
            (ACL_MASK, St::Group) => St::Other,
            (ACL_OTHER, St::Other) => St::Done,
            (ACL_OTHER, St::Group) if !needs_mask => St::Done,
            _ => return Err("ACL entries missing, repeated or out of order"),
        };
    }
    if st == St::Done {
        Ok(())
    } else {
        Err("ACL entries missing, repeated or out of order")
    }
}

/// The kernel's `posix_acl_equiv_mode`: the permission bits (0o777) the
/// ACL stands for (the mask in the group bits when there is one), and
/// whether the ACL says more than those bits can (named entries or a
/// mask), i.e. whether it must be stored at all.
pub fn equiv_mode(entries: &[AclEntry]) -> (u16, bool) {
    let mut mode = 0u16;
    let mut not_equiv = false;
    for e in entries {
        let p = e.perm & ACL_PERM_MASK;
        match e.tag {
            ACL_USER_OBJ => mode |= p << 6,
            ACL_GROUP_OBJ => mode |= p << 3,
            ACL_OTHER => mode |= p,
            ACL_MASK => {
                mode = (mode & !0o070) | (p << 3);
                not_equiv = true;
            }
            _ => not_equiv = true,
        }
    }
    (mode, not_equiv)
}

/// The kernel's `__posix_acl_chmod`: the ACL after a chmod to `mode`
/// (owner and other entries take the new bits, and the mask, or the
/// owning group without a mask, takes the group bits).
pub fn chmod(entries: &[AclEntry], mode: u16) -> Vec<AclEntry> {
    let has_mask = entries.iter().any(|e| e.tag == ACL_MASK);
    entries
        .iter()
        .map(|e| {
            let mut e = *e;
            match e.tag {
                ACL_USER_OBJ => e.perm = (mode >> 6) & 7,
                ACL_OTHER => e.perm = mode & 7,
                ACL_MASK => e.perm = (mode >> 3) & 7,
                ACL_GROUP_OBJ if !has_mask => e.perm = (mode >> 3) & 7,
                _ => {}
            }
            e
        })
        .collect()
}

/// What a new inode gets from its directory's default ACL (the kernel's
/// `posix_acl_create` with `posix_acl_create_masq`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    /// The new inode's mode (type bits kept).
    pub mode: u16,
    /// Its access ACL (`None` when the mode says it all).
    pub access: Option<Vec<AclEntry>>,
    /// Its default ACL (directories only).
    pub default: Option<Vec<AclEntry>>,
}

/// ACLs and mode of a new inode created with `mode` (the creator's
/// requested mode, type bits included) in a directory whose default ACL
/// is `parent_default`. Without a default ACL the umask applies and no
/// ACL is made; with one, the umask is ignored (as in the kernel).
/// Symlinks get neither.
pub fn inherit(
    parent_default: Option<&[AclEntry]>,
    mode: u16,
    is_dir: bool,
    is_symlink: bool,
    umask: u16,
) -> Inherited {
    let none = |mode| Inherited {
        mode,
        access: None,
        default: None,
    };
    if is_symlink {
        return none(mode);
    }
    let Some(def) = parent_default.filter(|d| !d.is_empty()) else {
        return none(mode & !(umask & 0o777));
    };
    let mut acc = def.to_vec();
    let mut m = mode & 0o777;
    let mut not_equiv = false;
    let mut group_obj = None;
    let mut mask_obj = None;
    for (i, e) in acc.iter_mut().enumerate() {
        match e.tag {
            ACL_USER_OBJ => {
                e.perm &= (m >> 6) | !7;
                m &= (e.perm << 6) | !0o700;
            }
            ACL_USER | ACL_GROUP => not_equiv = true,
            ACL_GROUP_OBJ => group_obj = Some(i),
            ACL_OTHER => {
                e.perm &= m | !7;
                m &= e.perm | !0o007;
            }
            ACL_MASK => {
                mask_obj = Some(i);
                not_equiv = true;
            }
            _ => {}
        }
    }
    if let Some(i) = mask_obj.or(group_obj) {
        let e = &mut acc[i];
        e.perm &= (m >> 3) | !7;
        m &= (e.perm << 3) | !0o070;
    }
    Inherited {
        mode: (mode & !0o777) | (m & 0o777),
        access: not_equiv.then_some(acc),
        default: is_dir.then(|| def.to_vec()),
    }
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
