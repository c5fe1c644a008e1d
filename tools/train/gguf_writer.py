#!/usr/bin/env python3
"""Minimal GGUF v3 writer (stdlib only, little-endian).

write_gguf(path, kv, tensors, alignment=32)
  kv      : list of (key, type, value); type one of
            'u8','i8','u16','i16','u32','i32','f32','bool','str','u64','i64','f64',
            'arr_<scalar type>' (e.g. 'arr_str', 'arr_i32', 'arr_u32')
  tensors : list of (name, dims, ggml_type, raw_bytes); dims in GGUF order (ne[0] first, i.e.
            the reverse of a row-major [out, in] shape); ggml_type 0 = F32, 1 = F16.
The file is padded with zeros to a multiple of `alignment` after the tensor-info section (also
when there are no tensors) and every tensor's data is aligned.
"""
import struct

T = {'u8': 0, 'i8': 1, 'u16': 2, 'i16': 3, 'u32': 4, 'i32': 5, 'f32': 6, 'bool': 7, 'str': 8,
     'arr': 9, 'u64': 10, 'i64': 11, 'f64': 12}
FMT = {'u8': '<B', 'i8': '<b', 'u16': '<H', 'i16': '<h', 'u32': '<I', 'i32': '<i', 'f32': '<f',
       'bool': '<?', 'u64': '<Q', 'i64': '<q', 'f64': '<d'}


def _str(s):
    b = s.encode('utf-8')
    return struct.pack('<Q', len(b)) + b


def _scalar(t, v):
    if t == 'str':
        return _str(v)
    return struct.pack(FMT[t], v)


def _value(t, v):
    if t.startswith('arr_'):
        et = t[4:]
        out = [struct.pack('<IQ', T[et], len(v))]
        if et == 'str':
            out.extend(_str(s) for s in v)
        else:
            out.append(struct.pack('<%d%s' % (len(v), FMT[et][1]), *v))
        return struct.pack('<I', T['arr']) + b''.join(out)
    return struct.pack('<I', T[t]) + _scalar(t, v)


def _pad(n, a):
    return (a - n % a) % a


def write_gguf(path, kv, tensors, alignment=32):
    parts = [b'GGUF', struct.pack('<IQQ', 3, len(tensors), len(kv))]
    for key, t, v in kv:
        parts.append(_str(key))
        parts.append(_value(t, v))
    off = 0
    infos = []
    for name, dims, gt, data in tensors:
        infos.append(_str(name) + struct.pack('<I', len(dims)) +
                     struct.pack('<%dQ' % len(dims), *dims) + struct.pack('<IQ', gt, off))
        off += len(data) + _pad(len(data), alignment)
    parts.extend(infos)
    head = b''.join(parts)
    with open(path, 'wb') as fh:
        fh.write(head)
        fh.write(b'\0' * _pad(len(head), alignment))
        for _, _, _, data in tensors:
            fh.write(data)
            fh.write(b'\0' * _pad(len(data), alignment))
