// Conversions between etcd's generated messages and our plain values (etcd_types.h).
#pragma once

#include "etcd/mvccpb/kv.pb.h"
#include "server/etcd/etcd_types.h"

namespace orthoserve::etcd {

inline KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

inline WatchEvent FromProto(const mvccpb::Event& event) {
  WatchEvent out;
  out.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
  out.key = event.kv().key();
  out.mod_revision = event.kv().mod_revision();
  if (out.type == WatchEvent::Type::kPut) {
    out.value = event.kv().value();
    out.create_revision = event.kv().create_revision();
    out.lease = event.kv().lease();
  }
  return out;
}

}  // namespace orthoserve::etcd
