// Implementation of server/fleet/wire/encoded_log.h.
#include "server/fleet/wire/encoded_log.h"

#include <utility>

#include "server/fleet/wire/fleet_codec.h"

namespace orthoserve {

EncodedLog::Bytes EncodedLog::Encoded(const SharedLogEntry& entry) {
  std::shared_ptr<Encoding> encoding;
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(entry.get());
    // A slot whose entry is gone (its address may be reused by a new entry) does not count.
    if (it != slots_.end() && it->second.entry.lock() == entry) {
      encoding = it->second.encoding;
    } else {
      absl::erase_if(slots_, [](const auto& slot) { return slot.second.entry.expired(); });
      encoding = std::make_shared<Encoding>();
      slots_[entry.get()] = Slot{entry, encoding};
      ++encodings_;
    }
  }
  absl::call_once(encoding->once, [&] {
    encoding->bytes = std::make_shared<std::string>(LogEntryToProto(*entry).SerializeAsString());
  });
  return encoding->bytes;
}

}  // namespace orthoserve
