// Implementation of server/fleet/logic/lone_placement.h.
#include "server/fleet/logic/lone_placement.h"

#include "server/fleet/logic/address.h"

namespace orthoserve {

std::shared_ptr<const LoneTarget> LonePlacement::Pick(const std::vector<Member>& members, double cost) {
  auto target = std::make_unique<LoneTarget>();
  target->rank = self_;
  std::shared_ptr<Load> load = load_;
  {
    absl::MutexLock lock(&load->mu);
    double best = load->outstanding[self_];
    for (const Member& m : members) {
      if (m.rank == self_ || m.fleet_port == 0) continue;
      const double outstanding = load->outstanding[m.rank];
      if (outstanding < best || (outstanding == best && !target->here() && m.rank < target->rank)) {
        best = outstanding;
        target->rank = m.rank;
        target->address = JoinHostPort(HostOf(m.address), m.fleet_port);
      }
    }
    load->outstanding[target->rank] += cost;
  }
  (target->here() ? load->here : load->forwarded).fetch_add(1);
  return std::shared_ptr<const LoneTarget>(target.release(), [load, cost](const LoneTarget* t) {
    {
      absl::MutexLock lock(&load->mu);
      load->outstanding[t->rank] -= cost;
    }
    delete t;
  });
}

}  // namespace orthoserve
