// Bearer tokens (server/rpc/auth.h) and their rotation without a restart: a token added to the
// file works and a removed one is refused within the reload interval; a file that does not read,
// is malformed or holds no tokens is not taken (a reload never turns authentication off); and on
// a real server a call admitted before the change goes on.
#include "server/rpc/auth.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/rpc/rpc_test_util.h"

namespace orthoserve::testing {
namespace {

using ::testing::HasSubstr;

// Writes `text` to `path` with modification time `tick` (seconds after a fixed instant), so
// that two writes within one clock tick still differ.
void Write(const std::string& path, const std::string& text, int tick) {
  {
    std::ofstream out(path, std::ios::trunc);
    out << text;
  }
  const timespec when[2] = {{1000000 + tick, 0}, {1000000 + tick, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), when, 0), 0);
}

absl::StatusOr<std::string> Tenant(const TokenAuth& auth, const std::string& token) {
  const std::string value = "Bearer " + token;
  const absl::string_view view(value);
  return auth.TenantOf(&view);
}

TEST(TokenAuthTest, AnAddedTokenWorksAndARemovedOneIsRefusedWithinTheReloadInterval) {
  const std::string path = ::testing::TempDir() + "/rotating_tokens.txt";
  Write(path, "secret-a alice\nsecret-b bob\n", 1);
  auto auth = TokenAuth::FromFile(path, absl::Milliseconds(100));
  ASSERT_OK(auth);
  EXPECT_THAT(Tenant(**auth, "secret-b"), ::orthoserve::testing::IsOkAndHolds(std::string("bob")));
  Write(path, "secret-a alice\nsecret-c carol\n", 2);
  // Within the interval the tokens in force stay; after it, the file's own.
  EXPECT_OK(Tenant(**auth, "secret-b"));
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_THAT(Tenant(**auth, "secret-b"), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("not known")));
  EXPECT_THAT(Tenant(**auth, "secret-c"), ::orthoserve::testing::IsOkAndHolds(std::string("carol")));
  EXPECT_EQ((*auth)->reloads(), 1);
}

TEST(TokenAuthTest, AFileThatIsBrokenEmptyOrGoneIsNotTaken) {
  const std::string path = ::testing::TempDir() + "/broken_tokens.txt";
  Write(path, "secret-a alice\n", 1);
  auto auth = TokenAuth::FromFile(path, absl::Milliseconds(50));
  ASSERT_OK(auth);
  int tick = 2;
  for (const std::string& text : {std::string("secret-a alice extra\n"), std::string("# nothing\n"),
                                  std::string("secret-a alice\nsecret-a bob\n")}) {
    Write(path, text, tick++);
    absl::SleepFor(absl::Milliseconds(80));
    EXPECT_THAT(Tenant(**auth, "secret-a"), ::orthoserve::testing::IsOkAndHolds(std::string("alice"))) << text;
    EXPECT_TRUE((*auth)->required()) << text;
  }
  ASSERT_EQ(std::remove(path.c_str()), 0);
  absl::SleepFor(absl::Milliseconds(80));
  EXPECT_OK(Tenant(**auth, "secret-a"));
  EXPECT_EQ((*auth)->reloads(), 0);
  // A good file again is taken.
  Write(path, "secret-z zed\n", tick++);
  absl::SleepFor(absl::Milliseconds(80));
  EXPECT_THAT(Tenant(**auth, "secret-z"), ::orthoserve::testing::IsOkAndHolds(std::string("zed")));
  EXPECT_THAT(Tenant(**auth, "secret-a"), StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
}

TEST(TokenAuthTest, WithoutReloadTheFileIsReadOnce) {
  const std::string path = ::testing::TempDir() + "/fixed_tokens.txt";
  Write(path, "secret-a alice\n", 1);
  auto auth = TokenAuth::FromFile(path);
  ASSERT_OK(auth);
  Write(path, "secret-b bob\n", 2);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_OK(Tenant(**auth, "secret-a"));
  EXPECT_EQ((*auth)->reloads(), 0);
}

TEST(TokenAuthTest, OnARunningServerACallAdmittedBeforeARotationGoesOn) {
  const std::string path = ::testing::TempDir() + "/server_tokens.txt";
  Write(path, "secret-a alice\nsecret-b bob\n", 1);
  ServerOptions options = TestServerOptions();
  options.token_file = path;
  options.token_reload_interval = absl::Milliseconds(100);
  auto server = Server::Create(options);
  ASSERT_OK(server);
  auto stub = StubFor(**server);
  // Bob's stream is admitted and sends its header; then his token is removed and carol's added.
  grpc::ClientContext bob;
  bob.AddMetadata("authorization", "Bearer secret-b");
  auto stream = stub->OrthogonalizeStream(&bob);
  ASSERT_TRUE(stream->Write(HeaderMessage(1)));
  Write(path, "secret-a alice\nsecret-c carol\n", 2);
  absl::SleepFor(absl::Milliseconds(200));
  const std::string in = Bytes(RandomMatrix(4, 4, 1), DType::kF32);
  std::vector<v1::StreamRequest> rest;
  AppendMatrix(rest, 0, Spec("w", {4, 4}, DType::kF32, NsOptions()), in);
  rest.push_back(EndMessage());
  for (const v1::StreamRequest& m : rest) ASSERT_TRUE(stream->Write(m));
  stream->WritesDone();
  v1::StreamResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
  // A new call with bob's token is refused; carol's works.
  v1::OrthogonalizeRequest request;
  *request.add_matrices()->mutable_spec() = Spec("w", {4, 4}, DType::kF32, NsOptions());
  request.mutable_matrices(0)->set_data(in);
  v1::OrthogonalizeResponse out;
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-b");
    EXPECT_EQ(stub->Orthogonalize(&context, request, &out).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer secret-c");
    EXPECT_TRUE(stub->Orthogonalize(&context, request, &out).ok());
  }
}

}  // namespace
}  // namespace orthoserve::testing
